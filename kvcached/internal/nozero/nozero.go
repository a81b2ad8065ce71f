// Package nozero allocates byte slices without zeroing them.
//
// kvcached allocates one buffer per value it receives or reads from disk
// (up to 64 MiB) and overwrites every byte before anyone reads it. make
// zeroes the memory first, a large share of kvcached's CPU under 1 MiB
// SETs. The standard library's strings.Builder allocates its buffer
// uninitialised (it only ever appends), so Make takes its memory from one.
package nozero

import (
	"strings"
	"unsafe"
)

// Make returns a byte slice of length and capacity n whose contents are
// undefined. The caller must overwrite all of it before reading it.
func Make(n int) []byte {
	if n <= 0 {
		return []byte{}
	}
	var b strings.Builder
	b.Grow(n)
	// The builder holds no bytes yet, so String shares its buffer's start
	// pointer; the builder is dropped here, so nothing else aliases it.
	return unsafe.Slice(unsafe.StringData(b.String()), n)
}
