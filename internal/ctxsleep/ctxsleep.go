// Package ctxsleep waits for a duration or until a context ends, whichever
// comes first: the back-off and polling sleep of every loop that must stop
// promptly at shutdown.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends, and then returns ctx.Err() (nil when the
// whole of d passed). A non-positive d returns at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
