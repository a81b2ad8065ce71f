package presence

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// TestMain fails the package's tests if any goroutine outlives them, but
// for those zmq4 leaves behind: every component here is stopped by its
// context or Close, and one that is not leaks for the life of the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.ZMQGoroutines()...)
}
