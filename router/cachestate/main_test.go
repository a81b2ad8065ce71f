package cachestate

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// component here is stopped by its context or Close, and one that is not
// leaks for the life of the router or kvcached.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-zeromq/zmq4 v0.17.0: a PUB socket's Close never closes its
		// writer, whose run loop then waits on its condition variable
		// forever; one per kvevents.Publisher, nothing here can stop it.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		// zmq4 v0.17.0: Socket.Close closes the connections it has listed,
		// but one accepted or dialled while Close runs is listed after it and
		// stays open, its reader blocked in Read (seen in 1 of 3 runs here).
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*qreader).listen"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubQReader).listen"),
	)
}
