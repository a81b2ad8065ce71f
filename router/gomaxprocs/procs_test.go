package gomaxprocs

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func newTest(t *testing.T, maxProcs int) (*Controller, *[]int) {
	t.Helper()
	var sets []int
	c, err := New(Config{Max: maxProcs, set: func(n int) { sets = append(sets, n) },
		cpuTime: func() (time.Duration, error) { return 0, nil }, stall: func() (time.Duration, bool) { return 0, false }})
	if err != nil {
		t.Fatal(err)
	}
	return c, &sets
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name    string
		max     int
		samples []float64 // cores used per sample
		want    []int     // Ps after each sample
	}{
		{"starts at max and shrinks after calm samples", 2, repeat(0.37, calm),
			append(repeat(2, calm-1), 1)},
		{"a busy sample restarts the calm count", 2, append(append(repeat(0.3, calm-1), 1.6), repeat(0.3, calm)...),
			append(append(repeat(2, calm-1), 2), append(repeat(2, calm-1), 1)...)},
		{"shrinks to the most any calm sample needed", 16, append(repeat(0.2, calm-1), 1.4),
			append(repeat(16, calm-1), 3)},
		{"grows by doubling up to max", 6, append(repeat(0.1, calm), 0.9, 1.9, 3.5, 5.9),
			append(append(repeat(6, calm-1), 1), 2, 4, 6, 6)},
		{"use between shrinking and growing stays", 4, append(repeat(0.2, calm), repeat(0.7, 40)...),
			append(append(repeat(4, calm-1), 1), repeat(1, 40)...)},
		{"one P is the floor", 1, repeat(0.0, calm*2), repeat(1, calm*2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newTest(t, tc.max)
			for i, u := range tc.samples {
				c.observe(u, 0)
				if c.cur != tc.want[i] {
					t.Fatalf("after sample %d (%.2f cores): %d Ps, want %d", i, u, c.cur, tc.want[i])
				}
			}
		})
	}
}

// TestContendedNodeGetsAllPs: while the node's tasks wait for CPUs, the
// router runs with a P per CPU whatever its own use, and shrinks again only
// after calm samples without contention.
func TestContendedNodeGetsAllPs(t *testing.T) {
	c, _ := newTest(t, 4)
	for range calm {
		c.observe(0.3, 0.1)
	}
	if c.cur != 1 {
		t.Fatalf("idle, uncontended: %d Ps, want 1", c.cur)
	}
	c.observe(0.3, 0.86)
	if c.cur != 4 {
		t.Fatalf("contended: %d Ps, want 4", c.cur)
	}
	for i := range calm - 1 {
		c.observe(0.3, 0.9)
		c.observe(0.3, 0.2)
		if c.cur != 4 {
			t.Fatalf("sample %d: %d Ps while contention comes and goes, want 4", i, c.cur)
		}
	}
	for range calm {
		c.observe(0.3, 0.2)
	}
	if c.cur != 1 {
		t.Fatalf("contention over: %d Ps, want 1", c.cur)
	}
}

func TestParseStall(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"some avg10=29.84 avg60=63.47 avg300=59.64 total=14328533103\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", 14328533103 * time.Microsecond, true},
		{"full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n", 0, false},
		{"some avg10=1.00 total=x\n", 0, false},
		{"", 0, false},
	} {
		got, ok := parseStall([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseStall(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestRunFollowsCPUTime drives Run with a fake CPU clock: idle, it shrinks to
// one P; under load it grows back to Max.
func TestRunFollowsCPUTime(t *testing.T) {
	var mu sync.Mutex
	var cpu time.Duration
	busy := false
	sets := make(chan int, 100)
	c, err := New(Config{Max: 4, Interval: time.Millisecond,
		set:   func(n int) { sets <- n },
		stall: func() (time.Duration, bool) { return 0, true },
		cpuTime: func() (time.Duration, error) {
			mu.Lock()
			defer mu.Unlock()
			if busy {
				cpu += 10 * time.Millisecond // far more than 4 cores for 1 ms
			}
			return cpu, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if n := <-sets; n != 4 {
		t.Fatalf("started with %d Ps, want Max", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wait := func(want int) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case n := <-sets:
				if n == want {
					return
				}
			case <-timeout:
				t.Fatalf("GOMAXPROCS never set to %d", want)
			}
		}
	}
	wait(1)
	mu.Lock()
	busy = true
	mu.Unlock()
	wait(4)
}

func TestGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Registerer: reg, set: func(int) {}}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "oasis_router_gomaxprocs" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, %v", mfs, err)
	}
	if got, want := mfs[0].GetMetric()[0].GetGauge().GetValue(), float64(runtime.GOMAXPROCS(0)); got != want {
		t.Fatalf("gauge = %v, want %v", got, want)
	}
	if _, err := New(Config{Registerer: reg, set: func(int) {}}); err == nil {
		t.Fatal("registering twice succeeded")
	}
}

func TestProcessCPUTimeAdvances(t *testing.T) {
	a, err := processCPUTime()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
	}
	b, err := processCPUTime()
	if err != nil || b <= a {
		t.Fatalf("CPU time %v then %v (%v)", a, b, err)
	}
}
