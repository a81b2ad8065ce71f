//go:build linux

package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/nomad-driver/supervisor/internal/wire"
)

// defaultStatsInterval is Stats' interval when the caller gives none.
const defaultStatsInterval = time.Second

// Stats samples the engine's process tree every interval until ctx ends or
// the supervisor stops answering, then closes the channel. CPU figures are
// over the interval between two samples (the first is taken at the call).
func (h *Handle) Stats(ctx context.Context, interval time.Duration) (<-chan *Usage, error) {
	if interval <= 0 {
		interval = defaultStatsInterval
	}
	prev, err := h.sample(ctx)
	if err != nil {
		return nil, fmt.Errorf("sampling engine stats: %w", err)
	}
	ch := make(chan *Usage)
	go func() {
		defer close(ch)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cur, err := h.sample(ctx)
			if err != nil {
				h.logger.Debug("stats: sampling the engine", "error", err)
				return
			}
			u := usageBetween(prev, cur)
			prev = cur
			select {
			case ch <- u:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

func (h *Handle) sample(ctx context.Context) (wire.Sample, error) {
	var s wire.Sample
	err := h.call(ctx, "Supervisor.Stats", wire.Empty{}, &s)
	return s, err
}

// usageBetween turns two samples into a Usage: memory of the later one,
// CPU percentages of the ticks spent in between. Processes that exited in
// between take their ticks with them; a negative difference counts as 0.
func usageBetween(prev, cur wire.Sample) *Usage {
	u := &Usage{Timestamp: cur.Time, RSS: cur.RSS, Swap: cur.Swap,
		Measured: append(append([]string(nil), memoryMeasured...), cpuMeasured...)}
	secs := cur.Time.Sub(prev.Time).Seconds()
	if secs <= 0 {
		return u
	}
	pct := func(a, b uint64) float64 {
		if b <= a {
			return 0
		}
		return float64(b-a) / clkTck / secs * 100
	}
	u.UserMode = pct(prev.UserTicks, cur.UserTicks)
	u.SystemMode = pct(prev.SystemTicks, cur.SystemTicks)
	u.Percent = u.UserMode + u.SystemMode
	u.TotalTicks = u.Percent / 100 * cur.CoreMHz
	return u
}
