package router

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// nomadEngineJob registers its engine with Nomad's native service discovery.
func nomadEngineJob(id, model string) string {
	return testbed.SimEngine{ID: id, Model: model, Provider: "nomad"}.HCL()
}

func TestNomadNativeDiscovery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := stack.RunJobHCL(ctx, nomadEngineJob("nsim", "nomad-llama"))
	must.NoError(t, err)
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), "nsim") })
	_, err = stack.WaitAllocsRunning(ctx, "nsim")
	must.NoError(t, err)

	r := startRouter(t, "oasis-e2e/nomad", "-discovery", "nomad", "-nomad-addr", stack.NomadAddr)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return r.metrics(t)["oasis_router_workers"]["model=nomad-llama"] == 1
	}), wait.Timeout(60*time.Second), wait.Gap(200*time.Millisecond)))
	code, events, err := chat(r.url, 4, "nomad-llama")
	must.NoError(t, err)
	must.Eq(t, 200, code)
	must.Greater(t, 0, events)

	must.NoError(t, stack.StopJob(ctx, "nsim"))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return r.metrics(t)["oasis_router_workers"]["model=nomad-llama"] == 0
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)))
	code, _, _ = chat(r.url, 4, "nomad-llama")
	must.Eq(t, 503, code)
}
