package federation

import (
	"sync"
	"time"
)

// BreakerState is a datacenter's circuit state (the metric's value).
type BreakerState int

// Breaker states.
const (
	Closed   BreakerState = iota // requests flow
	Open                         // failing: no requests until the cooldown passes
	HalfOpen                     // one probe request is in flight
)

func (s BreakerState) String() string {
	return [...]string{"closed", "open", "half_open"}[s]
}

// breaker is one datacenter's circuit breaker: failures consecutive
// failures open it for cooldown; then one request probes, and its outcome
// closes or reopens it.
type breaker struct {
	mu       sync.Mutex
	state    BreakerState
	fails    int
	openedAt time.Time
}

// allow reports whether a request may go now; in HalfOpen it admits one
// probe (the caller must report its outcome).
func (b *breaker) allow(now time.Time, cooldown time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Closed:
		return true
	case Open:
		if now.Sub(b.openedAt) < cooldown {
			return false
		}
		b.state = HalfOpen
		return true
	default:
		return false // the probe is out
	}
}

// usable is allow without taking the probe: whether a decision may pick it.
func (b *breaker) usable(now time.Time, cooldown time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == Closed || (b.state == Open && now.Sub(b.openedAt) >= cooldown)
}

// report records an outcome and returns the state after it.
func (b *breaker) report(ok bool, now time.Time, failures int) BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.state, b.fails = Closed, 0
		return b.state
	}
	b.fails++
	if b.state == HalfOpen || b.fails >= failures {
		b.state, b.openedAt = Open, now
	}
	return b.state
}

// spillWindow is the number of one-second buckets the spill share is
// measured over.
const spillWindow = 10

// SpillBudget tracks the share of recent requests sent to other
// datacenters, with hysteresis: past max it pauses spilling until the share
// falls to resume, so a datacenter near the cap does not flap. Time is the
// caller's (every method takes now), so a simulator drives it with a virtual
// clock; the zero value is ready.
type SpillBudget struct {
	mu      sync.Mutex
	total   [spillWindow]int
	spilled [spillWindow]int
	sec     int64 // unix second of the newest bucket
	paused  bool
}

func (b *SpillBudget) roll(now time.Time) int {
	s := now.Unix()
	if d := s - b.sec; d > 0 {
		for i := int64(1); i <= min(d, spillWindow); i++ {
			j := (b.sec + i) % spillWindow
			b.total[j], b.spilled[j] = 0, 0
		}
		b.sec = s
	}
	return int(s % spillWindow)
}

func (b *SpillBudget) share() float64 {
	t, s := 0, 0
	for i := range b.total {
		t += b.total[i]
		s += b.spilled[i]
	}
	if t == 0 {
		return 0
	}
	return float64(s) / float64(t)
}

// Paused reports whether spilling is paused now under max and resume.
func (b *SpillBudget) Paused(now time.Time, max, resume float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.roll(now)
	sh := b.share()
	switch {
	case !b.paused && sh >= max:
		b.paused = true
	case b.paused && sh <= resume:
		b.paused = false
	}
	return b.paused
}

// Record counts one request, spilled or served locally.
func (b *SpillBudget) Record(now time.Time, spilled bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.roll(now)
	b.total[i]++
	if spilled {
		b.spilled[i]++
	}
}

// Spilled counts a request already Recorded as sent away.
func (b *SpillBudget) Spilled(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.spilled[b.roll(now)]++
}
