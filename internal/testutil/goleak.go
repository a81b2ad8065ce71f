package testutil

import "go.uber.org/goleak"

// ZMQGoroutines are the goroutines go-zeromq/zmq4 v0.17.0 leaves running,
// which nothing in Oasis can stop: goleak ignores them in the packages that
// publish or subscribe KV events.
func ZMQGoroutines() []goleak.Option {
	return []goleak.Option{
		// A PUB socket's Close never closes its writer, whose run loop then
		// waits on its condition variable forever: one per kvevents.Publisher.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		// Socket.Close closes the connections it has listed, but one accepted
		// or dialled while Close runs is listed after it and stays open, its
		// reader blocked in Read.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*qreader).listen"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubQReader).listen"),
	}
}
