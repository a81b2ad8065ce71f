package ctxsleep

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestSleep(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	must.NoError(t, Sleep(ctx, 20*time.Millisecond))
	must.GreaterEq(t, 20*time.Millisecond, time.Since(start))
	must.NoError(t, Sleep(ctx, 0))

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(10*time.Millisecond, cancel)
	start = time.Now()
	must.ErrorIs(t, Sleep(cctx, time.Hour), context.Canceled)
	must.Less(t, time.Minute, time.Since(start))
	must.ErrorIs(t, Sleep(cctx, 0), context.Canceled)
}
