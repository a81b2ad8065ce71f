package llamacpp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// migrationStream is one greedy streaming request of the migration test.
type migrationStream struct {
	path, body string
}

// migrationStreams are n greedy (temperature 0, a seed) streams of path, long enough to
// be mid-stream when an engine is killed.
func migrationStreams(model, path string, n int) []migrationStream {
	var out []migrationStream
	for i := range n {
		body := fmt.Sprintf(`{"model":%q,"prompt":"Stream %d: Nomad schedules engines and","max_tokens":160,"temperature":0,"seed":1,"stream":true,"stream_options":{"include_usage":true}}`, model, i)
		if path == "/v1/chat/completions" {
			body = fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Stream %d: tell me about Consul."}],"max_tokens":160,"temperature":0,"seed":1,"stream":true,"stream_options":{"include_usage":true}}`, model, i)
		}
		out = append(out, migrationStream{path, body})
	}
	return out
}

// streamResult is a streamed answer as the client saw it.
type streamResult struct {
	text       string
	ids        map[string]bool
	completion int  // usage.completion_tokens
	errEvent   bool // an error event reached the client
	done       bool // data: [DONE]
	err        error
}

// readMigrationStream posts s to url and reads the stream; progress gets one value
// after its 24th event.
func readMigrationStream(url string, s migrationStream, progress chan<- struct{}) streamResult {
	r := streamResult{ids: map[string]bool{}}
	resp, err := http.Post(url+s.path, "application/json", strings.NewReader(s.body))
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.err = fmt.Errorf("status %s", resp.Status)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	events := 0
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			r.done = true
			break
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			r.err = fmt.Errorf("event %q: %w", data, err)
			return r
		}
		if len(c.Error) > 0 {
			r.errEvent = true
			continue
		}
		r.ids[c.ID] = true
		for _, ch := range c.Choices {
			r.text += ch.Text + ch.Delta.Content
		}
		if c.Usage != nil {
			r.completion = c.Usage.CompletionTokens
		}
		if events++; events == 24 && progress != nil {
			progress <- struct{}{}
		}
	}
	if r.err == nil {
		r.err = sc.Err()
	}
	return r
}

// llamaServerPID finds the llama-server the driver started on port.
func llamaServerPID(port int) int {
	needle := []byte(fmt.Sprintf("\x00--port\x00%d\x00", port))
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.HasPrefix(cmdline, []byte(llamaServer+"\x00")) || !bytes.Contains(cmdline, needle) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !bytes.Contains(stat, []byte(") Z ")) {
			return pid
		}
	}
	return 0
}

// kill -9 of a real llama-server under greedy streaming load (issue #37): the router
// continues every stream that was on it on another llama-server. 0 client-visible
// errors; every stream complete, with one id and usage for the whole answer; every
// completion token-exact against the uninterrupted greedy run of the same request. A
// chat continues from its text (llama-server's chat events carry no token ids), which
// the new engine tokenizes again: with this model's random text the rest differs from
// the uninterrupted answer, so a chat is checked for completeness, not exactness. A
// round of completions, then a round of chats, each killing an engine while every
// stream is mid-answer (24 events in).
//
// llama-server's greedy answers on CPU are exact only where the numerics are the same:
// with its default ubatch (512) a continuation's prefill of prompt + generated ids
// computes their KV in one batch, not token by token as the decode did, and with this
// model every continuation cut before token 90 of one 160-token answer flipped token
// 90; with -ub 1 every cut tried was exact. And a sequence decoded in one batch with
// another's can come out different from the same request alone (one of three prompts,
// even with -ub 1). So the engines run with -ub 1 and each stream decodes alone on its
// engine, as its uninterrupted run did: four engines, two streams a round, least_load
// routing (a stream, and a continuation, goes to an idle engine).
func TestMigrationKill9UnderStreamingLoad(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	const model = "tiny-migrate"
	addrs := runEnginesUbatch1(t, ctx, "llama-migrate", model, 4)
	doc := policy.Default()
	doc.Policy = scoring.LeastLoad
	limit := 2
	doc.MigrationLimit = &limit
	url := startRouter(t, doc, model)
	routerAddr := strings.TrimPrefix(url, "http://")
	alive := append([]string(nil), addrs...)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		before := scrape(t, routerAddr)
		victim := killRound(t, url, alive, migrationStreams(model, path, 2))
		m := scrape(t, routerAddr)
		migrated := m["oasis_router_migrations_total"] - before["oasis_router_migrations_total"]
		resent := m["oasis_router_migration_resent_tokens_total"] - before["oasis_router_migration_resent_tokens_total"]
		must.Positive(t, migrated, must.Sprintf("%s: no stream was migrated: the kill reached none", path))
		must.Positive(t, resent)
		must.Zero(t, m["oasis_router_migrations_failed_total"])
		t.Logf("%s: kill -9 of the llama-server at %s: 2 streams, %.0f migrated, 0 errors, every stream complete; %.0f tokens resent",
			path, victim, migrated, resent)
		alive = slices.DeleteFunc(alive, func(a string) bool { return a == victim })
		waitPassing(t, model, len(alive))
	}
}

// killRound runs streams' uninterrupted greedy answers one at a time, then all of
// them at once, kill -9s the engine of alive with the most busy slots when every
// stream is mid-answer, and checks each stream against its uninterrupted answer. It
// returns the address of the engine it killed.
func killRound(t *testing.T, url string, alive []string, streams []migrationStream) string {
	t.Helper()
	want := make([]streamResult, len(streams))
	for i, s := range streams {
		want[i] = readMigrationStream(url, s, nil)
		must.NoError(t, want[i].err)
		must.True(t, want[i].done)
		must.False(t, want[i].errEvent)
		must.Eq(t, 160, want[i].completion, must.Sprintf("stream %d", i))
	}
	got := make([]streamResult, len(streams))
	progress := make(chan struct{}, len(streams))
	var wg sync.WaitGroup
	for i, s := range streams {
		wg.Go(func() { got[i] = readMigrationStream(url, s, progress) })
	}
	for range streams { // every stream has streamed a few events: mid-answer on its engine
		select {
		case <-progress:
		case <-time.After(time.Minute):
			t.Fatal("the streams did not start")
		}
	}
	victim, busy := "", -1
	for _, a := range alive {
		n := 0
		for _, s := range slots(t, a) {
			if s.IsProcessing {
				n++
			}
		}
		if n > busy {
			victim, busy = a, n
		}
	}
	_, portText, _ := strings.Cut(victim, ":")
	port, err := strconv.Atoi(portText)
	must.NoError(t, err)
	pid := llamaServerPID(port)
	must.Positive(t, pid, must.Sprintf("no llama-server process on port %d", port))
	must.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	wg.Wait()
	for i := range streams {
		must.NoError(t, got[i].err, must.Sprintf("stream %d", i))
		must.False(t, got[i].errEvent, must.Sprintf("stream %d ended with an error event", i))
		must.True(t, got[i].done, must.Sprintf("stream %d", i))
		must.MapLen(t, 1, got[i].ids, must.Sprintf("stream %d", i))
		must.EqOp(t, want[i].completion, got[i].completion, must.Sprintf("stream %d", i))
		if streams[i].path == "/v1/completions" {
			must.EqOp(t, want[i].text, got[i].text, must.Sprintf("stream %d (%s) is not the uninterrupted greedy answer", i, streams[i].path))
		} else if got[i].text != want[i].text {
			t.Logf("stream %d (%s) differs from the uninterrupted greedy answer after %d bytes of %d", i, streams[i].path,
				commonPrefix(want[i].text, got[i].text), len(want[i].text))
		}
	}
	return victim
}

// waitPassing waits until Consul passes n engines of model.
func waitPassing(t *testing.T, model string, n int) {
	t.Helper()
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, fmt.Sprintf("%d passing engines of %s", n, model), func() bool {
		entries, _, err := stack.Consul.Health().Service("oasis-engine", engineTag, true, nil)
		if err != nil {
			return false
		}
		passing := 0
		for _, e := range entries {
			if e.Service.Meta["oasis_model"] == model {
				passing++
			}
		}
		return passing == n
	})
}

// runEnginesUbatch1 is runEngines for engines with -ub 1 (a prefill computes each
// token's KV as a decode does).
func runEnginesUbatch1(t *testing.T, ctx context.Context, prefix, model string, n int) []string {
	t.Helper()
	const args, withUB = `"-tb", "1"]`, `"-tb", "1", "-ub", "1"]`
	return runEnginesWith(t, ctx, prefix, model, n, func(id, model string) string {
		job := engineJob(id, model)
		must.StrContains(t, job, args)
		return strings.Replace(job, args, withUB, 1)
	})
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
