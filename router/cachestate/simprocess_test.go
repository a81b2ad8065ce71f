package cachestate

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/tokens"
	"github.com/shoenig/test/must"
)

// startSim runs a real oasis-sim serving sim-model on apiPort, publishing
// its KV events on evPort and, unless replayPort is 0, answering replay
// requests on replayPort.
func startSim(t *testing.T, bin string, apiPort, evPort, replayPort int) *testutil.Sim {
	t.Helper()
	cfg := fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:%d"}`, evPort)
	if replayPort != 0 {
		cfg = fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d"}`, evPort, replayPort)
	}
	return testutil.StartSim(t, testutil.SimConfig{Bin: bin, Model: "sim-model", Port: apiPort, Args: []string{
		"--block-size", "16", "--speed", "0", "--kv-events-config", cfg, "--log-level", "warn"}})
}

// complete serves one completion request on sim.
func complete(t *testing.T, sim *testutil.Sim, body string) {
	t.Helper()
	resp, err := http.Post("http://"+sim.Addr+"/v1/completions", "application/json", bytes.NewReader([]byte(body)))
	must.NoError(t, err)
	defer resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
}

func completionBody(prompt string) string {
	return fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":2}`, prompt)
}

// TestEventsFromRealOasisSim subscribes the cache state to a real oasis-sim
// process's ZMQ KV events: the blocks of a served prompt appear in the index
// under the router's own digests (computed from the event token ids, matched
// against digests of the router's tokenization of the same request), and a
// restarted engine (sequence numbers start over) drops the old entries.
func TestEventsFromRealOasisSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	apiPort, evPort := testutil.FreePort(t), testutil.FreePort(t)
	sim := startSim(t, bin, apiPort, evPort, 0)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(Config{})
	defer s.Close()
	s.Sync(ctx, []Engine{{ID: "sim-1", Model: "sim-model", Address: sim.Addr, BlockSize: 16, KVEvents: fmt.Sprintf("tcp://*:%d", evPort)}})

	// PUB drops messages until the subscription is up: warm up until a batch arrives.
	i := 0
	testutil.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "kv events", func() bool {
		if st, _ := s.EngineStats("sim-1"); st.Batches > 0 {
			return true
		}
		i++
		complete(t, sim, completionBody(fmt.Sprintf("warm up %d %s", i, strings.Repeat("x ", 40))))
		return false
	})

	keysOf := func(body string) []uint64 {
		req, err := openai.ParseRequest("/v1/completions", []byte(body))
		must.NoError(t, err)
		toks, err := tokens.Sim{}.Tokenize(ctx, "sim-model", req.Prompt)
		must.NoError(t, err)
		k, err := s.Keys(nil, "sim-model", 16, toks)
		must.NoError(t, err)
		return k
	}
	waitMatch := func(keys []uint64, want int) {
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("the index to hold %d blocks", want), func() bool {
			return matchBlocks(s, keys, "sim-1") == want
		})
	}

	body := completionBody("The quick brown fox jumps over the lazy dog. " + strings.Repeat("All work and no play makes Jack a dull boy. ", 12))
	keys := keysOf(body)
	must.Greater(t, 4, len(keys))
	complete(t, sim, body)
	waitMatch(keys, len(keys))
	// A request sharing only the first blocks matches only those.
	other := keysOf(completionBody("The quick brown fox jumps over the lazy dog. " + strings.Repeat("Something else entirely, said nobody. ", 12)))
	must.Eq(t, keys[0], other[0])
	got := matchBlocks(s, other, "sim-1")
	must.Between(t, 1, got, len(keys)-1)

	// Restart the engine on the same ports: its events start again at seq 0.
	sim.Stop()
	sim = startSim(t, bin, apiPort, evPort, 0)
	// The first batches of the new process may be lost while the subscriber
	// redials, so each try uses a new prompt.
	var sent [][]uint64
	testutil.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "events from the restarted engine", func() bool {
		for _, k := range sent {
			if matchBlocks(s, k, "sim-1") == len(k) {
				return true
			}
		}
		body2 := completionBody(fmt.Sprintf("A different prompt %d after the restart. %s", len(sent), strings.Repeat("Lorem ipsum dolor sit amet. ", 12)))
		sent = append(sent, keysOf(body2))
		complete(t, sim, body2)
		return false
	})
	must.Eq(t, 0, matchBlocks(s, keys, "sim-1"), must.Sprint("entries from before the restart must be dropped"))
	st, _ := s.EngineStats("sim-1")
	must.Positive(t, st.Resyncs)
}
