// Package gomaxprocs sizes the Go scheduler (GOMAXPROCS) to the router's own CPU
// use. The router runs as a Nomad system job beside the engines it fronts, and
// mostly needs a fraction of one core: with a P per CPU, every goroutine woken
// by the network poller can start another thread spinning on an idle P, which
// costs futex wake-ups, context switches and CPU taken from the engines on the
// same node. Running with as many Ps as the load needs, and growing as soon as
// it needs more, keeps that cost off the node. When the node's CPUs are
// saturated it runs with a P per CPU, as Go does by default: then a thread of
// its own is often waiting for a CPU, and requests must not queue behind it.
package gomaxprocs

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// Thresholds, in CPU used per P over a sample. Growing doubles the Ps once
// their use passes grow, so a burst gets its cores within a few samples; the
// count shrinks only to what keeps use below shrinkTo, and only after calm
// samples in a row all asked for fewer, so the two never flap.
// A node is contended when some task waited for a CPU for more than
// contended of a sample (Linux pressure stall information).
const (
	grow      = 0.75
	shrinkTo  = 0.5
	calm      = 16
	contended = 0.5
)

// Config of a Controller. Zero values take the defaults.
type Config struct {
	// Max is the most Ps used (default: runtime.GOMAXPROCS(0) when New is
	// called, which is the CPUs available to the process, cgroup limits
	// included).
	Max int
	// Interval between samples of the process's CPU time (default 250ms).
	Interval time.Duration
	Logger   hclog.Logger
	// Registerer, when set, gets oasis_router_gomaxprocs.
	Registerer prometheus.Registerer

	// For tests: the process's CPU time, the node's CPU stall time (ok
	// false where the kernel does not report it), and what sets GOMAXPROCS.
	cpuTime func() (time.Duration, error)
	stall   func() (time.Duration, bool)
	set     func(int)
}

// Controller adjusts GOMAXPROCS between 1 and Max while Run runs.
type Controller struct {
	cfg   Config
	cur   int
	calm  int // samples in a row that asked for fewer Ps
	fewer int // the most Ps any of those samples asked for
}

// New returns a controller. It starts with Max Ps, so a router started into
// load is never short of threads while the first samples come in.
func New(cfg Config) (*Controller, error) {
	if cfg.Max <= 0 {
		cfg.Max = runtime.GOMAXPROCS(0)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 250 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.cpuTime == nil {
		cfg.cpuTime = processCPUTime
	}
	if cfg.stall == nil {
		cfg.stall = nodeCPUStall
	}
	if cfg.set == nil {
		cfg.set = func(n int) { runtime.GOMAXPROCS(n) }
	}
	c := &Controller{cfg: cfg, cur: cfg.Max}
	c.cfg.set(c.cur)
	if cfg.Registerer != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "oasis_router", Name: "gomaxprocs",
			Help: "Ps (threads running Go code at once) the router uses now; sized to its CPU use up to the CPUs available"},
			func() float64 { return float64(runtime.GOMAXPROCS(0)) })
		if err := cfg.Registerer.Register(g); err != nil {
			return nil, fmt.Errorf("registering the gomaxprocs gauge: %w", err)
		}
	}
	return c, nil
}

// Run samples the process's CPU time and the node's CPU stall time every
// Interval and resizes until ctx ends; it returns nil then. A failed sample
// (it cannot fail on Linux) leaves the size as it is.
func (c *Controller) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	last, err := c.cfg.cpuTime()
	lastStall, stallOK := c.cfg.stall()
	lastAt := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			cpu, cerr := c.cfg.cpuTime()
			st, sok := c.cfg.stall()
			if wall := now.Sub(lastAt); err == nil && cerr == nil && wall > 0 {
				stalled := 0.0
				if stallOK && sok {
					stalled = float64(st-lastStall) / float64(wall)
				}
				c.observe(float64(cpu-last)/float64(wall), stalled)
			}
			last, lastStall, lastAt, err, stallOK = cpu, st, now, cerr, sok
		}
	}
}

// observe takes one sample, in cores used and the share of it the node's
// tasks waited for a CPU, and applies what it decides.
func (c *Controller) observe(used, stalled float64) {
	n := c.decide(used, stalled)
	if n == c.cur {
		return
	}
	c.cfg.Logger.Debug("resizing GOMAXPROCS", "from", c.cur, "to", n, "cores_used", used, "cpu_stalled", stalled)
	c.cur = n
	c.cfg.set(n)
}

// decide returns the Ps for the next interval after a sample.
func (c *Controller) decide(used, stalled float64) int {
	if stalled > contended {
		c.calm = 0
		return c.cfg.Max
	}
	if used > grow*float64(c.cur) && c.cur < c.cfg.Max {
		c.calm = 0
		return min(c.cfg.Max, 2*c.cur)
	}
	want := max(1, int(math.Ceil(used/shrinkTo)))
	if want >= c.cur {
		c.calm = 0
		return c.cur
	}
	if c.calm == 0 || want > c.fewer {
		c.fewer = want
	}
	c.calm++
	if c.calm < calm {
		return c.cur
	}
	c.calm = 0
	return c.fewer
}

// nodeCPUStall is the node's total time during which some task waited for a
// CPU, from /proc/pressure/cpu (Linux 4.20+ with PSI); ok is false without it.
func nodeCPUStall() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, false
	}
	return parseStall(b)
}

// parseStall reads the "some" line's total (microseconds) of a PSI file.
func parseStall(b []byte) (time.Duration, bool) {
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte("some "))
		if !ok {
			continue
		}
		for f := range bytes.FieldsSeq(rest) {
			if v, ok := bytes.CutPrefix(f, []byte("total=")); ok {
				us, err := strconv.ParseInt(string(v), 10, 64)
				return time.Duration(us) * time.Microsecond, err == nil
			}
		}
	}
	return 0, false
}

// processCPUTime is the user and system CPU time of the whole process.
func processCPUTime() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("reading the process's CPU time: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
