//go:build !linux

package rawsock

import "syscall"

const supported = false

func read(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.ENOSYS }
func write(uintptr, []byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }
