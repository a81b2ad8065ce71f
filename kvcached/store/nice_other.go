//go:build !linux

package store

// lowerThreadPriority is a no-op where priority is not per thread.
func lowerThreadPriority() error { return nil }
