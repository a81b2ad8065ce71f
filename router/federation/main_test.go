package federation

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: Run
// must stop its listener, peer watchers and pushes when its context ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
