package cachestate

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/gobuild"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/tokens"
	"github.com/shoenig/test/must"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// buildSim builds cmd/oasis-sim into a temp dir.
func buildSim(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must.NoError(t, gobuild.Commands(context.Background(), dir, "github.com/oasis-llm/oasis/cmd/oasis-sim"))
	return filepath.Join(dir, "oasis-sim")
}

type simProc struct {
	cmd *exec.Cmd
	api string
}

func startSim(t *testing.T, bin string, apiPort, evPort int) *simProc {
	t.Helper()
	cfg := fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:%d"}`, evPort)
	cmd := exec.Command(bin, "serve", "sim-model", "--port", fmt.Sprint(apiPort), "--block-size", "16",
		"--speed", "0", "--kv-events-config", cfg, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must.NoError(t, cmd.Start())
	p := &simProc{cmd: cmd, api: fmt.Sprintf("127.0.0.1:%d", apiPort)}
	t.Cleanup(p.stop)
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + p.api + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		must.True(t, time.Now().Before(deadline), must.Sprint("oasis-sim did not become healthy"))
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *simProc) stop() {
	if p.cmd.Process == nil || p.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

func (p *simProc) complete(t *testing.T, body string) {
	t.Helper()
	resp, err := http.Post("http://"+p.api+"/v1/completions", "application/json", bytes.NewReader([]byte(body)))
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
	bin := buildSim(t)
	apiPort, evPort := freePort(t), freePort(t)
	sim := startSim(t, bin, apiPort, evPort)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(Config{})
	defer s.Close()
	s.Sync(ctx, []Engine{{ID: "sim-1", Model: "sim-model", Address: sim.api, BlockSize: 16, KVEvents: fmt.Sprintf("tcp://*:%d", evPort)}})

	// PUB drops messages until the subscription is up: warm up until a batch arrives.
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; ; i++ {
		st, _ := s.EngineStats("sim-1")
		if st.Batches > 0 {
			break
		}
		must.True(t, time.Now().Before(deadline), must.Sprint("no kv events received"))
		sim.complete(t, completionBody(fmt.Sprintf("warm up %d %s", i, strings.Repeat("x ", 40))))
		time.Sleep(100 * time.Millisecond)
	}

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
		deadline := time.Now().Add(10 * time.Second)
		for matchBlocks(s, keys, "sim-1") != want {
			must.True(t, time.Now().Before(deadline), must.Sprintf("index holds %d of %d blocks", matchBlocks(s, keys, "sim-1"), want))
			time.Sleep(20 * time.Millisecond)
		}
	}

	body := completionBody("The quick brown fox jumps over the lazy dog. " + strings.Repeat("All work and no play makes Jack a dull boy. ", 12))
	keys := keysOf(body)
	must.Greater(t, 4, len(keys))
	sim.complete(t, body)
	waitMatch(keys, len(keys))
	// A request sharing only the first blocks matches only those.
	other := keysOf(completionBody("The quick brown fox jumps over the lazy dog. " + strings.Repeat("Something else entirely, said nobody. ", 12)))
	must.Eq(t, keys[0], other[0])
	got := matchBlocks(s, other, "sim-1")
	must.Between(t, 1, got, len(keys)-1)

	// Restart the engine on the same ports: its events start again at seq 0.
	sim.stop()
	sim = startSim(t, bin, apiPort, evPort)
	// The first batches of the new process may be lost while the subscriber
	// redials, so each try uses a new prompt.
	deadline = time.Now().Add(15 * time.Second)
	for i := 0; ; i++ {
		body2 := completionBody(fmt.Sprintf("A different prompt %d after the restart. %s", i, strings.Repeat("Lorem ipsum dolor sit amet. ", 12)))
		keys2 := keysOf(body2)
		sim.complete(t, body2)
		time.Sleep(100 * time.Millisecond)
		if matchBlocks(s, keys2, "sim-1") == len(keys2) {
			break
		}
		must.True(t, time.Now().Before(deadline), must.Sprint("no events from the restarted engine"))
	}
	must.Eq(t, 0, matchBlocks(s, keys, "sim-1"), must.Sprint("entries from before the restart must be dropped"))
	st, _ := s.EngineStats("sim-1")
	must.Positive(t, st.Resyncs)
}
