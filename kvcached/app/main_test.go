package app

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// component here is stopped by Run's context or Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
