//go:build !linux

package h1

import (
	"errors"
	"syscall"
)

// hangups is Linux only: elsewhere each connection's goroutine hands its
// requests to a worker goroutine and waits on the socket itself.
type hangups struct{}

func newHangups() (*hangups, error) { return nil, errors.New("h1: hangup watching is Linux only") }
func (h *hangups) add(*conn) bool   { return false }
func (h *hangups) remove(*conn)     {}
func (h *hangups) run()             {}
func (h *hangups) close()           {}
func unread(syscall.RawConn) int    { return 0 }
