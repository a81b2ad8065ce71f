package openaisdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// longPrompt is a prompt of n distinct words starting at word seed: at
// least n oasis-sim tokens, shared with no other seed.
func longPrompt(seed, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d ", seed*100000+i)
	}
	return b.String()
}

// complete posts a completion naming name and returns the prompt tokens
// the engine counted.
func complete(ctx context.Context, url, name, prompt string) (int, error) {
	body, _ := json.Marshal(map[string]any{"model": name, "prompt": prompt, "max_tokens": 4})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var v struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", name, resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v.Usage.PromptTokens, err
}

// holds reports whether the sim at addr serves name (it loaded the adapter).
func holds(t *testing.T, addr, name string) bool {
	t.Helper()
	b, err := get("http://" + addr + "/v1/models")
	must.NoError(t, err)
	return bytes.Contains(b, []byte(`"id":"`+name+`"`))
}

// TestAdapterRequestsFollowTheLoad: under the default policy, requests
// naming an adapter two engines can load go to the engine that loaded it
// (the other would first pay the load in its time to first token) while
// that engine's prefill queue is short; once its queue costs more than a
// load, the other engine loads the adapter and takes requests too.
func TestAdapterRequestsFollowTheLoad(t *testing.T) {
	routerBin = testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-router")
	cc, consulAddr := testutil.StartConsul(t)
	sims := make([]*testutil.Sim, 2)
	for i, id := range []string{"sim-a", "sim-b"} {
		sims[i] = testutil.StartSim(t, testutil.SimConfig{Bin: simBin, Model: model, Env: []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=true"},
			Args: []string{"--block-size", "16", "--enable-lora", "--step-time-per-prefill-token", "100us"}})
		register(t, cc, id, sims[i], map[string]string{"oasis_lora_loadable": loadable + "=/adapters/dyn"})
	}
	addr := testutil.FreeAddr(t)
	cmd := exec.Command(routerBin, "-listen", addr, "-consul-addr", consulAddr) // the default policy, from Consul KV
	cmd.Env = append(cmd.Environ(), "CONSUL_HTTP_TOKEN=")
	p := testutil.Start(t, cmd)
	url := "http://" + addr
	testutil.Eventually(t, 20*time.Second, "the router to route "+loadable, func() bool {
		if p.Exited() {
			t.Fatalf("oasis-router exited:\n%s", p.Output())
		}
		_, err := get(url + "/v1/models/" + loadable)
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// One at a time: the engine that loaded the adapter takes every request
	// (prompts of 2,000 tokens, none shared: the prefix term is silent, and
	// the router learns the engine's prefill rate).
	for i := range 8 {
		n, err := complete(ctx, url, loadable, longPrompt(i, 2000))
		must.NoError(t, err)
		must.GreaterEq(t, 2000, n)
	}
	holder, other := sims[0], sims[1]
	if !holds(t, holder.Addr, loadable) {
		holder, other = other, holder
	}
	must.True(t, holds(t, holder.Addr, loadable))
	must.False(t, holds(t, other.Addr, loadable), must.Sprint("a request went to the engine without the adapter"))

	// Together: 16 prompts of 4,000 tokens queue 6.4 s of prefill on the
	// holder, far past a load elsewhere.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := complete(ctx, url, loadable, longPrompt(100+i, 4000))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must.NoError(t, err)
	}
	must.True(t, holds(t, other.Addr, loadable), must.Sprint("the overloaded holder kept every request"))
}
