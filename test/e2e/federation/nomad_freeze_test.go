package federation

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// localCallBound is what a region-local Nomad call may take while the other
// region is frozen: generous on a loaded machine, far below the ~36 s a
// call forwarded to a frozen region hangs.
const localCallBound = 3 * time.Second

// timed runs f under its own timeout (a call to a frozen region never
// returns by itself soon) and returns how long it took.
func timed(timeout time.Duration, f func(*nomadapi.QueryOptions) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	err := f((&nomadapi.QueryOptions{}).WithContext(ctx))
	return time.Since(start), err
}

// TestFreezeSecondRegionNomad freezes region dc2's Nomad: region dc1 goes on
// as if alone. Its API answers local calls within localCallBound while a
// call forwarded to dc2 hangs until its own timeout, and a job registered
// in dc1 during the freeze runs and its service passes in dc1's Consul.
func TestFreezeSecondRegionNomad(t *testing.T) {
	dc1, dc2 := fed.DC("dc1"), fed.DC("dc2")
	suspects := func() int { return strings.Count(nomadLog(t, dc1), "memberlist: Suspect ") }
	before := suspects()
	must.NoError(t, dc2.Freeze(testbed.AgentNomad))
	frozen := time.Now()
	t.Cleanup(func() { must.NoError(t, dc2.Thaw(testbed.AgentNomad)) })
	// dc1's servers have noticed the silent peer (if they would stall on it,
	// they do from here) once a WAN probe to it went unanswered.
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "dc1's Nomad to suspect frozen dc2's server", func() bool {
		return suspects() > before
	})
	t.Logf("dc1's Nomad suspected frozen dc2 after %v", time.Since(frozen).Round(10*time.Millisecond))

	took, err := timed(5*time.Second, func(q *nomadapi.QueryOptions) error {
		_, _, err := dc1.Nomad.Jobs().List((&nomadapi.QueryOptions{Region: dc2.Region}).WithContext(q.Context()))
		return err
	})
	must.True(t, errors.Is(err, context.DeadlineExceeded), must.Sprintf("a call forwarded to frozen dc2: %v", err))
	t.Logf("job list forwarded to frozen dc2: gave up after %v (%v)", took.Round(10*time.Millisecond), err)

	for name, call := range map[string]func(*nomadapi.QueryOptions) error{
		"jobs":   func(q *nomadapi.QueryOptions) error { _, _, err := dc1.Nomad.Jobs().List(q); return err },
		"nodes":  func(q *nomadapi.QueryOptions) error { _, _, err := dc1.Nomad.Nodes().List(q); return err },
		"evals":  func(q *nomadapi.QueryOptions) error { _, _, err := dc1.Nomad.Evaluations().List(q); return err },
		"allocs": func(q *nomadapi.QueryOptions) error { _, _, err := dc1.Nomad.Allocations().List(q); return err },
	} {
		took, err := timed(2*localCallBound, call)
		must.NoError(t, err, must.Sprintf("dc1 %s", name))
		must.Less(t, localCallBound, took, must.Sprintf("dc1 %s", name))
		t.Logf("dc1 %s with dc2 frozen: %v", name, took.Round(100*time.Microsecond))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	job, err := dc1.ParseJobHCL(testbed.SimEngine{ID: "freeze-sim", Model: "freeze"}.HCL())
	must.NoError(t, err)
	job.Region = &dc1.Region
	_, _, err = dc1.Nomad.Jobs().Register(job, (&nomadapi.WriteOptions{}).WithContext(ctx))
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, dc1.StopJob(context.Background(), "freeze-sim")) })
	entries, err := dc1.WaitServicePassing(ctx, "oasis-engine", 1)
	must.NoError(t, err)
	must.Eq(t, "freeze", entries[0].Service.Meta["oasis_model"])
	t.Logf("job registered in dc1 during the freeze: service passing %v after the register call",
		time.Since(start).Round(100*time.Millisecond))
}

// nomadLog is the whole of a datacenter's Nomad agent log.
func nomadLog(t *testing.T, s *testbed.Stack) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.Dir, "nomad.log"))
	must.NoError(t, err)
	return string(data)
}
