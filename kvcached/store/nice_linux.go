package store

import "golang.org/x/sys/unix"

// lowerThreadPriority gives the calling OS thread the lowest CPU priority
// (nice 19), so the spiller's file writes and index updates run when request
// handling leaves a CPU idle. Linux's nice is per thread; the caller has
// locked its goroutine to the thread. Failure leaves the priority as it was.
func lowerThreadPriority() error {
	return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
}
