package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// nomadEngineJob registers its engine with Nomad's native service discovery.
// Its KV-events endpoint is advertised as "tcp://${NOMAD_ADDR_kv}" in the
// service meta, which the router has to resolve from the allocation.
func nomadEngineJob(id, model string) string {
	return testbed.SimEngine{ID: id, Model: model, Provider: "nomad", KVEvents: true}.HCL()
}

// sendPrompt posts a non-streaming chat completion and returns its status.
func sendPrompt(t *testing.T, url, model, prompt string) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":2}`, model, prompt)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
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
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "the router to see the nomad-llama worker from Nomad's catalog", func() bool {
		return r.metrics(t)["oasis_router_workers"]["model=nomad-llama"] == 1
	})
	code, events, err := chat(r.url, 4, "nomad-llama")
	must.NoError(t, err)
	must.Eq(t, 200, code)
	must.Greater(t, 0, events)

	// The engine's KV events reach the router only if the meta's
	// ${NOMAD_ADDR_kv} was resolved: a repeated long prompt then matches
	// the blocks the first one stored.
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 24)
	testutil.EventuallyEvery(t, 30*time.Second, 500*time.Millisecond, "a repeated prompt to match stored prefix blocks", func() bool {
		must.Eq(t, 200, sendPrompt(t, r.url, "nomad-llama", prompt))
		sum := 0.0
		for _, v := range r.metrics(t)["oasis_router_prefix_matched_blocks_total"] {
			sum += v
		}
		return sum > 0
	})
	// A meta value the router cannot resolve would be dropped (the engine
	// then learned approximately, which also matches): say it was not.
	logText, err := os.ReadFile(r.log)
	must.NoError(t, err)
	must.StrNotContains(t, string(logText), "cannot resolve")

	must.NoError(t, stack.StopJob(ctx, "nsim"))
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the router to drop the stopped nomad-llama worker", func() bool {
		return r.metrics(t)["oasis_router_workers"]["model=nomad-llama"] == 0
	})
	code, _, _ = chat(r.url, 4, "nomad-llama")
	must.Eq(t, 503, code)
}
