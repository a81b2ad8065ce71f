package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/router/tokens"
	"github.com/oasis-llm/oasis/router/worker"
)

// The in-flight record and its κ_f charge through the router app's real
// request path, with two real oasis-sim engines that publish their KV events
// over ZMQ (the router subscribes as it does in production). The engines
// prefill at 1 ms a token (33× the H100 default), so a 2,048-token prompt's
// prefill outlasts the router's decisions on the requests sent after it: its
// events cannot have arrived, which each part checks on the router's event
// index rather than assuming it. The policy is the default weights without
// the power term, whose consolidation (a busy engine scores higher) would
// blur the distributions measured here; κ and κ_f are the defaults.
const (
	eventsPolicy    = `{"policy":"weighted","weights":{"ttft":2,"prefix":1,"load":0.2}}`
	simPrefillToken = "1ms"
	hotTokens       = 2048 // a shared prefix: 128 blocks
	// burstFollowers is the size of a hot prefix's burst (testHotPrefixBurst):
	// past where κ_f = 2 replicates an in-flight copy (the seventh follower),
	// short of where κ = 4 would move a follower off a holder (the sixteenth).
	burstFollowers = 11
)

func TestEventEnginesThroughRouter(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	t.Run("record then events", func(t *testing.T) { testRecordThenEvents(t, bin) })
	for _, tc := range []struct {
		name       string
		tune       func(*App)
		replicated bool
	}{
		{"default charge replicates", nil, true},
		// κ_f = κ: an in-flight copy charged as a confirmed one.
		{"charge as confirmed piles on one", chargeInflightAsConfirmed, false},
	} {
		t.Run(tc.name, func(t *testing.T) { testHotPrefixBurst(t, bin, tc.tune, tc.replicated) })
	}
}

// (a) Followers of a new prefix sent while the leader's prefill runs (no
// event yet) land on the leader's engine, credited by the in-flight record;
// a control prompt of the same length sent at that moment goes to the other
// engine, as every follower would without the record. (b) Once the events
// arrive the holder is confirmed: a burst that, against an in-flight copy,
// replicates the prefix (testHotPrefixBurst) stays on the confirmed holder,
// charged κ; and a prefix an engine computed outside this router (no record
// anywhere) draws its followers to that engine, from its events alone.
func testRecordThenEvents(t *testing.T, bin string) {
	c := startEventCluster(t, bin, nil)
	hot := promptOf(t, "alpha", hotTokens)
	lp := hot + " " + promptOf(t, "leader", 64)
	prompts, keys := make([]string, 6), make([][]uint64, 6)
	for i := range prompts {
		prompts[i] = hot + " " + promptOf(t, "follower"+strconv.Itoa(i), 64)
		keys[i] = c.keysOf(t, prompts[i])
	}
	control := promptOf(t, "control", hotTokens+64)
	ck, lk := c.keysOf(t, control), c.keysOf(t, lp)
	before := c.engineCounters(t)
	leader := c.send(t, lp, 4)
	holder := c.waitDecision(t, lk)
	other := c.otherThan(holder)

	var followers []*call
	for i := range prompts {
		followers = append(followers, c.send(t, prompts[i], 4))
		must.Eq(t, holder, c.waitDecision(t, keys[i]), must.Sprintf("follower %d left the leader's engine", i))
	}
	ctl := c.send(t, control, 4)
	must.Eq(t, other, c.waitDecision(t, ck), must.Sprint("a new prompt as long as the followers goes to the idle engine"))
	c.requireUnconfirmed(t, hot)
	for _, f := range append(followers, leader, ctl) {
		f.wait(t)
	}
	after := c.engineCounters(t)
	must.Eq(t, 7, after[holder].requests-before[holder].requests)
	must.Eq(t, 1, after[other].requests-before[other].requests)
	// Each follower's prompt came from the engine's cache but its suffix.
	must.GreaterEq(t, 6*(hotTokens-16), after[holder].hits-before[holder].hits)

	// (b) The events arrive: the holder is confirmed, nothing of it in flight.
	hk := c.keysOf(t, hot)
	testutil.Eventually(t, 20*time.Second, "the holder's events to confirm the prefix", func() bool {
		return matched(c.cache.EventIndex(), hk, holder) == len(hk)
	})
	for _, m := range c.cache.Match(hk, prefixindex.DefaultTierWeights(), nil) {
		if m.Worker == holder {
			must.Eq(t, 0, m.Inflight)
		}
	}
	seq := c.burst(t, hot, "confirmed", burstFollowers)
	must.Eq(t, burstFollowers, count(seq, holder), must.Sprintf("a confirmed holder keeps the burst (κ): %v", seq))

	// A prefix computed on the other engine directly: only its events tell.
	direct := promptOf(t, "direct", 512)
	c.sims[other].complete(t, direct)
	dk := c.keysOf(t, direct)
	testutil.Eventually(t, 20*time.Second, "the other engine's events to report the direct prompt", func() bool {
		return matched(c.cache.EventIndex(), dk, other) == len(dk)
	})
	must.Eq(t, 0, matched(c.cache.InflightIndex(), dk, holder)+matched(c.cache.InflightIndex(), dk, other))
	for i := range 3 {
		p := direct + " " + promptOf(t, "after"+strconv.Itoa(i), 64)
		f := c.send(t, p, 4)
		must.Eq(t, other, c.waitDecision(t, c.keysOf(t, p)), must.Sprintf("follower %d of the direct prompt", i))
		f.wait(t)
	}
}

// (c) A burst of burstFollowers followers, 512 new tokens each, sent while
// the leader's 2,560-token prefill (the prefix and its own 512) runs. Charged
// κ_f = 2 for the in-flight copy, the other engine costs the 2,560 tokens
// plus 4,096 charged, so the leader's engine keeps the first six followers
// and the seventh, whose wait there would pass that, takes a copy to the
// other engine. Charged κ = 4 (the record counted as confirmed), the
// other engine costs 2,560 plus 8,192, which the leader's queue passes only
// after the fifteenth follower: every follower of the burst piles on the
// leader's engine. (With the record off the first follower would go to the
// idle engine, as the control prompt of testRecordThenEvents does.) A
// confirmed holder, (b), is charged for its leader's suffix alone and keeps
// some twenty.
func testHotPrefixBurst(t *testing.T, bin string, tune func(*App), replicated bool) {
	c := startEventCluster(t, bin, tune)
	seq := c.burst(t, promptOf(t, "hot", hotTokens), "burst", burstFollowers)
	first, other := c.firstHolder, c.otherThan(c.firstHolder)
	t.Logf("engine of each follower (the leader's: %s): %v", first, seq)
	if !replicated {
		must.Eq(t, burstFollowers, count(seq, first), must.Sprint("charged as confirmed, the burst piles on the leader's engine"))
		return
	}
	must.Positive(t, count(seq, other), must.Sprint("the hot prefix is replicated to the second engine"))
	// The early followers stay: without the record the first would go to the idle engine.
	must.Eq(t, []string{first, first}, seq[:2])
}

// chargeInflightAsConfirmed sets κ_f to κ: the build before the charge.
func chargeInflightAsConfirmed(a *App) {
	term, _ := a.terms.Term("ttft")
	term.(*scoring.TTFTTerm).InflightRecompute = scoring.DefaultRecompute
}

// eventCluster is a router app over two oasis-sim engines with KV events.
type eventCluster struct {
	*running
	sims        map[string]*simEngine
	firstHolder string // the engine the last burst's leader went to
}

type simEngine struct{ *testutil.Sim }

// startEventCluster starts the engines and the router (tune, if any, changes
// the app after New and before Run), waits until the router is subscribed
// to both engines' events and has measured both engines' prefill rate.
func startEventCluster(t *testing.T, bin string, tune func(*App)) *eventCluster {
	c := &eventCluster{sims: map[string]*simEngine{}}
	var insts []discovery.Instance
	for i := range 2 {
		id, ev := "e"+strconv.Itoa(i), testutil.FreeAddr(t)
		c.sims[id] = &simEngine{testutil.StartSim(t, testutil.SimConfig{Bin: bin, Model: "m", Args: []string{
			"--block-size", "16", "--step-time-per-prefill-token", simPrefillToken, "--log-level", "warn",
			"--kv-events-config", fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://%s"}`, ev)}})}
		insts = append(insts, discovery.Instance{ID: id, Address: c.sims[id].Addr,
			Meta: map[string]string{"oasis_model": "m", "oasis_engine": "sim", discovery.MetaKVEvents: "tcp://" + ev}})
	}
	cfg := baseConfig(t, c.sims["e0"].Addr)
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "router", Level: hclog.Warn, Output: tlog{t}}) // not every decision
	cfg.PolicyFile = policyFile(t, eventsPolicy)
	c.running = startTuned(t, cfg, tune)
	testutil.Eventually(t, 10*time.Second, "the static engine in the pool", func() bool {
		return len(c.Pool().Workers("m")) == 1
	})
	c.Pool().Set(insts)
	testutil.Eventually(t, 10*time.Second, "both engines event-driven", func() bool {
		return len(c.Pool().Workers("m")) == 2 && c.cache.EventDriven("e0") && c.cache.EventDriven("e1")
	})
	// A PUB socket drops what precedes the subscription: straight to each
	// engine until a batch of its events has arrived.
	n := 0
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "a batch of events from each engine", func() bool {
		ok := true
		for id, s := range c.sims {
			if st, _ := c.cache.EngineStats(id); st.Batches == 0 {
				n++
				s.complete(t, promptOf(t, fmt.Sprintf("connect%d", n), 48))
				ok = false
			}
		}
		return ok
	})
	c.measureRates(t)
	return c
}

// measureRates sends pairs of long new prompts through the router (the
// second of a pair goes to the engine the first left idle) until the router
// has learned both engines' prefill rate from their first tokens.
func (c *eventCluster) measureRates(t *testing.T) {
	n := 0
	testutil.EventuallyEvery(t, 60*time.Second, 10*time.Millisecond, "both engines' prefill rates measured", func() bool {
		learned := 0
		for _, w := range c.Pool().Workers("m") {
			if w.Signals().PrefillRate != worker.DefaultPrefillRate {
				learned++
			}
		}
		if learned == 2 {
			return true
		}
		var pair []*call
		for range 2 {
			n++
			pair = append(pair, c.send(t, promptOf(t, fmt.Sprintf("measure%d", n), 1100), 2))
		}
		for _, p := range pair {
			p.wait(t)
		}
		return false
	})
}

// burst sends a leader with the prefix hot, then n followers (hot and 512
// new tokens each) one after another while the leader's prefill runs, each as
// soon as the router has decided the previous one, and returns the engine
// each follower went to (from the router's record of its decisions), checked
// against the engines' own request counters.
func (c *eventCluster) burst(t *testing.T, hot, tag string, n int) []string {
	// Prompts and keys first: the leader's prefill bounds the time the
	// decisions have.
	prompts, keys := make([]string, n), make([][]uint64, n)
	for i := range prompts {
		prompts[i] = hot + " " + promptOf(t, fmt.Sprintf("%s-%d", tag, i), 512)
		keys[i] = c.keysOf(t, prompts[i])
	}
	lp := hot + " " + promptOf(t, tag+"-leader", 512)
	lk := c.keysOf(t, lp)
	before := c.engineCounters(t)
	calls := []*call{c.send(t, lp, 4)}
	c.firstHolder = c.waitDecision(t, lk)
	seq := make([]string, n)
	for i := range seq {
		calls = append(calls, c.send(t, prompts[i], 4))
		seq[i] = c.waitDecision(t, keys[i])
	}
	if matched(c.cache.EventIndex(), c.keysOf(t, hot), c.firstHolder) == 0 {
		c.requireUnconfirmed(t, hot) // a new prefix: nobody confirmed it during the decisions
	}
	for _, f := range calls {
		f.wait(t)
	}
	after := c.engineCounters(t)
	for id := range c.sims {
		want := count(seq, id)
		if id == c.firstHolder {
			want++
		}
		must.Eq(t, want, after[id].requests-before[id].requests, must.Sprintf("engine %s's own count", id))
	}
	return seq
}

func count(seq []string, id string) int {
	n := 0
	for _, s := range seq {
		if s == id {
			n++
		}
	}
	return n
}

// requireUnconfirmed fails the test when an engine's events already report
// the prompt: the decisions before this call were made without them.
func (c *eventCluster) requireUnconfirmed(t *testing.T, prompt string) {
	t.Helper()
	keys := c.keysOf(t, prompt)
	for id := range c.sims {
		if got := matched(c.cache.EventIndex(), keys, id); got > 0 {
			t.Fatalf("precondition: engine %s's events reported %d blocks of the prefix before the decisions were checked (the engines prefill too fast for this machine's load)", id, got)
		}
	}
}

func (c *eventCluster) otherThan(id string) string {
	if id == "e0" {
		return "e1"
	}
	return "e0"
}

// keysOf is the router's block digests of a completion prompt (oasis-sim's
// tokenizer, as the gateway tokenizes for an engine of type sim).
func (c *eventCluster) keysOf(t *testing.T, prompt string) []uint64 {
	t.Helper()
	raw, err := json.Marshal(prompt)
	must.NoError(t, err)
	toks, err := tokens.Sim{}.Tokenize(context.Background(), "m", openai.Prompt{Prompt: raw})
	must.NoError(t, err)
	keys, err := c.cache.Keys(nil, "m", 16, toks)
	must.NoError(t, err)
	return keys
}

// waitDecision waits until the router's in-flight record holds every block
// of keys on one engine (its decision for the request) and returns it.
func (c *eventCluster) waitDecision(t *testing.T, keys []uint64) string {
	t.Helper()
	var id string
	testutil.EventuallyEvery(t, 20*time.Second, 2*time.Millisecond, "the router's decision in its in-flight record", func() bool {
		for _, m := range c.cache.InflightIndex().Match(keys, prefixindex.DefaultTierWeights(), nil) {
			if m.Blocks == len(keys) {
				id = m.Worker
				return true
			}
		}
		return false
	})
	return id
}

// matched is the blocks of keys ix holds for engine id.
func matched(ix *prefixindex.Index, keys []uint64, id string) int {
	for _, m := range ix.Match(keys, prefixindex.DefaultTierWeights(), nil) {
		if m.Worker == id {
			return m.Blocks
		}
	}
	return 0
}

type simCounters struct{ requests, hits int }

// engineCounters reads each engine's own vllm:request_success_total and
// vllm:prefix_cache_hits_total.
func (c *eventCluster) engineCounters(t *testing.T) map[string]simCounters {
	t.Helper()
	out := map[string]simCounters{}
	for id, s := range c.sims {
		m, err := testutil.ScrapeMetrics(context.Background(), http.DefaultClient, "http://"+s.Addr+"/metrics")
		must.NoError(t, err)
		out[id] = simCounters{requests: int(m.Sum("vllm:request_success_total", nil)), hits: int(m.Sum("vllm:prefix_cache_hits_total", nil))}
	}
	return out
}

// complete serves one completion straight on the engine, not through the router.
func (s *simEngine) complete(t *testing.T, prompt string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)
	resp, err := http.Post("http://"+s.Addr+"/v1/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
}

// call is one streaming completion through the router, read to its end in
// the background (the router learns an engine's prefill rate from a
// stream's first token).
type call struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func (c *eventCluster) send(t *testing.T, prompt string, maxTokens int) *call {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cl := &call{cancel: cancel, done: make(chan struct{})}
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d,"stream":true}`, prompt, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("http")+"/v1/completions", strings.NewReader(body))
	must.NoError(t, err)
	go func() {
		defer close(cl.done)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cl.err = err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			cl.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
			return
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
		}
		cl.err = sc.Err()
	}()
	t.Cleanup(func() { cancel(); <-cl.done })
	return cl
}

// wait waits for the stream's end and fails the test on its error.
func (cl *call) wait(t *testing.T) {
	t.Helper()
	select {
	case <-cl.done:
	case <-time.After(time.Minute):
		t.Fatal("a completion did not end within a minute")
	}
	must.NoError(t, cl.err)
}

// startTuned is start with tune (if any) applied between New and Run.
func startTuned(t *testing.T, cfg Config, tune func(*App)) *running {
	t.Helper()
	a, err := New(cfg)
	must.NoError(t, err)
	if tune != nil {
		tune(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{App: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return r
}

// promptOf is a text of at least n oasis-sim tokens whose words all carry
// tag, so that two tags share no block.
func promptOf(t *testing.T, tag string, n int) string {
	t.Helper()
	var b strings.Builder
	for i := 0; ; i += 16 {
		for j := range 16 {
			fmt.Fprintf(&b, "%s%d ", tag, i+j)
		}
		raw, err := json.Marshal(b.String())
		must.NoError(t, err)
		toks, err := tokens.Sim{}.Tokenize(context.Background(), "m", openai.Prompt{Prompt: raw})
		must.NoError(t, err)
		if len(toks) >= n {
			return strings.TrimSpace(b.String())
		}
	}
}
