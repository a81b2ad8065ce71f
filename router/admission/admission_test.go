package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/policy"
)

func TestAcquire(t *testing.T) {
	cases := []struct {
		name     string
		lim      policy.Limits
		hold     int   // slots taken first
		wantErr  error // for the next Acquire
		wantWait bool
	}{
		{"unlimited", policy.Limits{}, 100, nil, false},
		{"under cap", policy.Limits{MaxInFlight: 2, MaxQueue: 0}, 1, nil, false},
		{"at cap, no queue", policy.Limits{MaxInFlight: 2, MaxQueue: 0}, 2, ErrQueueFull, false},
		{"at cap, queue times out", policy.Limits{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: 20 * time.Millisecond}, 1, ErrQueueTimeout, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := New()
			for range tc.hold {
				_, err := c.Acquire(context.Background(), "m", tc.lim)
				must.NoError(t, err)
			}
			start := time.Now()
			_, err := c.Acquire(context.Background(), "m", tc.lim)
			if tc.wantErr == nil {
				must.NoError(t, err)
			} else {
				must.True(t, errors.Is(err, tc.wantErr), must.Sprintf("got %v", err))
			}
			if tc.wantWait {
				must.GreaterEq(t, tc.lim.QueueTimeout, time.Since(start))
			}
			must.Eq(t, 0, c.Queued("m"))
		})
	}
}

func TestQueueFIFOHandOff(t *testing.T) {
	c := New()
	lim := policy.Limits{MaxInFlight: 1, MaxQueue: 2, QueueTimeout: time.Minute}
	rel, err := c.Acquire(context.Background(), "m", lim)
	must.NoError(t, err)
	order := make(chan int, 2)
	for i := range 2 {
		go func() {
			r, err := c.Acquire(context.Background(), "m", lim)
			if err == nil {
				order <- i
				r()
			}
		}()
		testutil.Eventually(t, 5*time.Second, fmt.Sprintf("%d queued", i+1), func() bool { return c.Queued("m") == i+1 })
	}
	// Queue full now: a third is refused at once.
	_, err = c.Acquire(context.Background(), "m", lim)
	must.True(t, errors.Is(err, ErrQueueFull))
	rel()
	must.Eq(t, 0, <-order)
	must.Eq(t, 1, <-order)
	testutil.Eventually(t, 5*time.Second, "nothing in flight", func() bool { return c.InFlight("m") == 0 })
}

func TestCancelWhileQueued(t *testing.T) {
	c := New()
	lim := policy.Limits{MaxInFlight: 1, MaxQueue: 5, QueueTimeout: time.Minute}
	rel, err := c.Acquire(context.Background(), "m", lim)
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := c.Acquire(ctx, "m", lim); done <- err }()
	testutil.Eventually(t, 5*time.Second, "one queued", func() bool { return c.Queued("m") == 1 })
	cancel()
	must.True(t, errors.Is(<-done, context.Canceled))
	must.Eq(t, 0, c.Queued("m"))
	rel()
	must.Eq(t, 0, c.InFlight("m"))
}

func TestLimitsGrowAdmitsWaiters(t *testing.T) {
	c := New()
	small := policy.Limits{MaxInFlight: 1, MaxQueue: 5, QueueTimeout: time.Minute}
	_, err := c.Acquire(context.Background(), "m", small)
	must.NoError(t, err)
	done := make(chan error)
	go func() { _, err := c.Acquire(context.Background(), "m", small); done <- err }()
	testutil.Eventually(t, 5*time.Second, "one queued", func() bool { return c.Queued("m") == 1 })
	// A request under the larger (reloaded) limits admits the waiter too.
	big := policy.Limits{MaxInFlight: 3, MaxQueue: 5, QueueTimeout: time.Minute}
	_, err = c.Acquire(context.Background(), "m", big)
	must.NoError(t, err)
	must.NoError(t, <-done)
	must.Eq(t, 3, c.InFlight("m"))
}

func TestModelsIndependent(t *testing.T) {
	c := New()
	lim := policy.Limits{MaxInFlight: 1}
	_, err := c.Acquire(context.Background(), "a", lim)
	must.NoError(t, err)
	_, err = c.Acquire(context.Background(), "b", lim)
	must.NoError(t, err)
}

func TestAcquireSlotHandsOffOnRelease(t *testing.T) {
	c := New()
	lim := policy.Limits{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: time.Minute}
	s, err := c.AcquireSlot(context.Background(), "m", lim)
	must.NoError(t, err)
	must.Eq(t, 1, c.InFlight("m"))
	got := make(chan error, 1)
	go func() {
		s2, err := c.AcquireSlot(context.Background(), "m", lim)
		if err == nil {
			s2.Release()
		}
		got <- err
	}()
	testutil.Eventually(t, 5*time.Second, "one queued", func() bool { return c.Queued("m") == 1 })
	_, err = c.AcquireSlot(context.Background(), "m", lim)
	must.True(t, errors.Is(err, ErrQueueFull))
	s.Release()
	must.NoError(t, <-got)
	must.Eq(t, 0, c.InFlight("m"))
}

// With Share, the cap is this router's part of max_in_flight; Refill admits
// waiters when the part grows.
func TestShareAndRefill(t *testing.T) {
	c := New()
	var mu sync.Mutex
	share := 1
	c.Share = func(model string, max int) int {
		mu.Lock()
		defer mu.Unlock()
		must.Eq(t, 6, max)
		return share
	}
	lim := policy.Limits{MaxInFlight: 6, MaxQueue: 4, QueueTimeout: time.Minute}
	_, err := c.Acquire(context.Background(), "m", lim)
	must.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		_, err := c.Acquire(context.Background(), "m", lim)
		got <- err
	}()
	testutil.Eventually(t, 5*time.Second, "the second request queued", func() bool { return c.Queued("m") == 1 })
	must.Eq(t, map[string]Load{"m": {InFlight: 1, Queued: 1}}, c.Loads())
	mu.Lock()
	share = 2
	mu.Unlock()
	c.Refill()
	must.NoError(t, <-got)
	must.Eq(t, 2, c.InFlight("m"))
}
