// Package autoscale runs the Nomad Autoscaler on the local stack `make up AUTOSCALE=1` starts
// (real Consul, Nomad, Prometheus, router, oasis-sim engines at --speed 1, ACLs on) with the demo
// recipe's own `scaling` policy (recipes/tiny/sim/agg: the Oasis strategy plugin, oasis-sizing,
// on the router's arrival rate), its windows shortened: a ramp of the arrival rate past what one
// engine serves within the TTFT SLO makes it add engines until the SLO is met again, a trickle
// brings the count back down, and no request fails through either.
package autoscale

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/localstack"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

const (
	model = "tiny-sim"
	job   = "tiny-sim-agg"
	slo   = time.Second // the TTFT SLO the policy is given (ttft_slo_seconds)
	// Each engine runs 2 sequences at once (max_num_seqs) and a request takes ~0.6 s (100 tokens at
	// ~6 ms a step): one engine serves ~3 requests/s at most, so 6/s queue on it (TTFT past the
	// SLO) and fit on three or four; the policy's capacity is 2/s per engine (engine_capacity).
	baseRate, peakRate, idleRate = 1.0, 6.0, 0.5
	maxTokens                    = 100
)

// demoVariables are the recipe's scaling policy with test-sized windows: the same check and
// strategy (observability/README.md "Scaling signals"), a 30 s rate window (three scrapes) and
// shorter cooldowns.
var demoVariables = map[string]string{
	"count":                       "1",
	"scaling_min":                 "1",
	"scaling_max":                 "4",
	"max_num_seqs":                "2",
	"ttft_slo_seconds":            "1",
	"engine_capacity":             "2",
	"scaling_rate_window":         "30s",
	"scaling_evaluation_interval": "5s",
	"scale_out_cooldown":          "10s",
	"scale_in_cooldown":           "15s",
}

func TestLoadRampScalesOutAndIdleScalesIn(t *testing.T) {
	if _, err := testbed.AutoscalerBinary(); err != nil {
		testutil.SkipUnlessCI(t, err.Error())
	}
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	home := filepath.Join(t.TempDir(), "oasis-home")
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
	defer cancel()
	s, err := localstack.Up(ctx, root, home, testWriter{t}, localstack.Options{Autoscale: true, DemoVariables: demoVariables})
	t.Cleanup(func() {
		if err := localstack.Down(home, io.Discard); err != nil {
			t.Errorf("down: %v", err)
		}
	})
	if err != nil && s != nil {
		t.Logf("nomad log:\n%s", s.NomadLog())
	}
	must.NoError(t, err)
	routers, err := s.WaitServicePassing(ctx, "oasis-router", 1)
	must.NoError(t, err)
	l := &load{router: fmt.Sprintf("http://%s:%d", routers[0].Service.Address, routers[0].Service.Port), maxTokens: maxTokens}
	waitEngines(t, ctx, s, 1, time.Minute)

	// Below the SLO risk: 1 request/s on one engine (1.1 engines' worth with the headroom: one).
	l.setRate(ctx, baseRate)
	waitResults(t, l, time.Now(), 10)
	must.Eq(t, 1, groupCount(t, s), must.Sprint("the base load must not scale out"))

	// The ramp: six times that. The autoscaler must add engines until the TTFT SLO holds.
	ramp := time.Now()
	l.setRate(ctx, peakRate)
	before := waitResults(t, l, ramp, 12)
	t.Logf("at %.0f requests/s on 1 engine: client TTFT p90 %s (SLO %s)", peakRate, ttftP90(before), slo)
	must.Greater(t, slo, ttftP90(before), must.Sprint("the ramp must push one engine past the SLO, or scaling out proves nothing"))
	n := waitCount(t, ctx, s, "scale out", 5*time.Minute, func(c int) bool { return c >= 2 })
	firstOut := time.Since(ramp)
	waitEngines(t, ctx, s, n, 2*time.Minute)
	t.Logf("time to scale out: %s from the ramp to the autoscaler's first count change (%d engines), %s to its engines passing",
		firstOut.Round(time.Second), n, time.Since(ramp).Round(time.Second))
	met := waitSLOMet(t, ctx, s, l)
	t.Logf("SLO met again %s after the ramp with %d engines", time.Since(ramp).Round(time.Second), met)

	// Idle but for a trickle: the count goes back to the minimum, each removed engine drained.
	idle := time.Now()
	l.setRate(ctx, idleRate)
	waitCount(t, ctx, s, "scale in", 5*time.Minute, func(c int) bool { return c == 1 })
	waitEngines(t, ctx, s, 1, 2*time.Minute)
	t.Logf("scaled in from %d engines to 1 in %s", met, time.Since(idle).Round(time.Second))
	results := l.stop(ctx)

	failed := 0
	for _, r := range results {
		if r.err != nil {
			failed++
			t.Logf("failed request started %s after the ramp: %v", r.start.Sub(ramp).Round(time.Millisecond), r.err)
		}
	}
	t.Logf("%d requests across scale-out and scale-in, %d failed", len(results), failed)
	must.Zero(t, failed)
}

// waitSLOMet waits until the autoscaler has settled (no count change for a while) and the TTFT
// p90 of the requests started since then is within the SLO, and returns the engine count.
func waitSLOMet(t *testing.T, ctx context.Context, s *testbed.Stack, l *load) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		n := groupCount(t, s)
		waitEngines(t, ctx, s, n, 2*time.Minute)
		from := time.Now()
		rs := waitResults(t, l, from, 20)
		p90 := ttftP90(rs)
		t.Logf("%d engines: client TTFT p90 %s over %d requests (SLO %s)", n, p90, len(rs), slo)
		if p90 <= slo && groupCount(t, s) == n {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("TTFT p90 still %s with %d engines after 5 minutes (SLO %s)", p90, n, slo)
		}
	}
}

// waitResults waits for at least n results of requests started since from, and returns them.
func waitResults(t *testing.T, l *load, from time.Time, n int) []result {
	t.Helper()
	var rs []result
	eventually(t, 2*time.Minute, fmt.Sprintf("%d requests answered", n), func() bool {
		rs = l.since(from)
		return len(rs) >= n
	})
	return rs
}

// waitCount waits until the engine group's count (what the autoscaler sets) satisfies ok.
func waitCount(t *testing.T, ctx context.Context, s *testbed.Stack, what string, timeout time.Duration, ok func(int) bool) int {
	t.Helper()
	var n int
	eventually(t, timeout, what, func() bool {
		n = groupCount(t, s)
		return ok(n) || ctx.Err() != nil
	})
	must.NoError(t, ctx.Err())
	return n
}

// groupCount is the engine group's count in the job Nomad runs.
func groupCount(t *testing.T, s *testbed.Stack) int {
	t.Helper()
	j, _, err := s.Nomad.Jobs().Info(job, nil)
	must.NoError(t, err)
	must.SliceNotEmpty(t, j.TaskGroups)
	return *j.TaskGroups[0].Count
}

// waitEngines waits until exactly n engines of the model pass their checks in Consul (the
// router's view: a removed engine leaves it before it drains).
func waitEngines(t *testing.T, ctx context.Context, s *testbed.Stack, n int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%d engines passing", n), func() bool {
		es, _, err := s.Consul.Health().Service("oasis-engine", "", true, nil)
		if err != nil || ctx.Err() != nil {
			return ctx.Err() != nil
		}
		c := 0
		for _, e := range es {
			if e.Service.Meta["oasis_model"] == model {
				c++
			}
		}
		return c == n
	})
}

// eventually fails the test unless cond holds within timeout, polling every 500 ms: the stack
// shares the machine's cores with the engines under load.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(cond), wait.Timeout(timeout), wait.Gap(500*time.Millisecond)),
		must.Sprintf("timed out waiting for %s", what))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}
