package drivers

import (
	"context"
	"errors"
	"testing"
	"time"
)

func recvEvent(t *testing.T, ch <-chan *TaskEvent) (*TaskEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-ch:
		return ev, ok
	case <-time.After(5 * time.Second):
		t.Fatal("no event and no close within 5s")
		return nil, false
	}
}

// TestEventerFanOut: every subscriber gets every event; a subscription
// ends (its channel closes) with its context, and all end with the
// Eventer's.
func TestEventerFanOut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	e := NewEventer(ctx, nil)
	subCtx, subCancel := context.WithCancel(context.Background())
	a, err := e.TaskEvents(subCtx)
	must(t, err)
	b, err := e.TaskEvents(context.Background())
	must(t, err)

	must(t, e.EmitEvent(&TaskEvent{TaskID: "t1", Message: "one"}))
	for _, ch := range []<-chan *TaskEvent{a, b} {
		if ev, ok := recvEvent(t, ch); !ok || ev.Message != "one" {
			t.Fatalf("got %+v, %v", ev, ok)
		}
	}

	subCancel()
	if _, ok := recvEvent(t, a); ok {
		t.Fatal("a's channel stayed open after its context ended")
	}
	must(t, e.EmitEvent(&TaskEvent{TaskID: "t1", Message: "two"}))
	if ev, _ := recvEvent(t, b); ev.Message != "two" {
		t.Fatalf("b got %+v", ev)
	}

	cancel()
	if _, ok := recvEvent(t, b); ok {
		t.Fatal("b's channel stayed open after the Eventer ended")
	}
	if err := e.EmitEvent(&TaskEvent{}); !errors.Is(err, ErrEventerClosed) {
		t.Fatalf("emit after close: %v", err)
	}
	if _, err := e.TaskEvents(context.Background()); !errors.Is(err, ErrEventerClosed) {
		t.Fatalf("subscribe after close: %v", err)
	}
}

// TestEventerBoundedForSlowSubscriber: a subscriber that never reads
// costs an emitter at most the send timeout per event beyond its buffer;
// other subscribers still get every event.
func TestEventerBoundedForSlowSubscriber(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := NewEventer(ctx, nil)
	_, err := e.TaskEvents(ctx) // never read
	must(t, err)
	fast, err := e.TaskEvents(ctx)
	must(t, err)
	got := make(chan int, 1)
	go func() {
		n := 0
		for range fast {
			n++
			if n == eventBuffer+1 {
				got <- n
			}
		}
	}()
	start := time.Now()
	for range eventBuffer + 1 {
		must(t, e.EmitEvent(&TaskEvent{TaskID: "t1"}))
	}
	if d := time.Since(start); d > eventSendTimeout+2*time.Second {
		t.Fatalf("emitting took %s with a stalled subscriber", d)
	}
	select {
	case n := <-got:
		if n != eventBuffer+1 {
			t.Fatalf("fast subscriber got %d", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reading subscriber missed events")
	}
}
