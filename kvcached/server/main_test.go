package server

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// component here is stopped by its context or Close, and one that is not
// leaks for the life of the router or kvcached.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
