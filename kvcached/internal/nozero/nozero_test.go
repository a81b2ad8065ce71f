package nozero

import (
	"runtime"
	"testing"
)

func TestMakeIsWritableAndIndependent(t *testing.T) {
	for _, n := range []int{0, 1, 100, 4096, 1 << 20} {
		a, b := Make(n), Make(n)
		if len(a) != n || cap(a) != n {
			t.Fatalf("Make(%d): len %d cap %d", n, len(a), cap(a))
		}
		for i := range a {
			a[i], b[i] = 1, 2
		}
		runtime.GC()
		for i := range a {
			if a[i] != 1 || b[i] != 2 {
				t.Fatalf("Make(%d): buffers alias or were freed at %d", n, i)
			}
		}
	}
}

func BenchmarkMake1MiB(b *testing.B) {
	b.SetBytes(1 << 20)
	for b.Loop() {
		buf := Make(1 << 20)
		buf[0] = 1
	}
}

func BenchmarkMakeZeroed1MiB(b *testing.B) {
	b.SetBytes(1 << 20)
	for b.Loop() {
		buf := make([]byte, 1<<20)
		buf[0] = 1
	}
}
