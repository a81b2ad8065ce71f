// Package kvrouting runs KV-aware routing end to end on the real Nomad +
// Consul test bed: three oasis-sim engines run by the llm driver with ZMQ KV
// events on, registered in Consul with the oasis_kv_events meta; the router's
// gateway and Consul discovery in front of them, with the prefix term fed by
// router/cachestate (subscribed to each engine's events) and router/tokens.
// The evidence is the engines' own vllm:prefix_cache_hits_total.
package kvrouting

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/gateway"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/router/tokens"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }

const modelName = "kvllama"

// engineJob is one oasis-sim engine with KV events and their replay buffer on
// Nomad-assigned ports, advertised in the oasis_kv_events and
// oasis_kv_events_replay service meta as the driver documents.
func engineJob(id string) string {
	return testbed.SimEngine{ID: id, Model: modelName, KVEvents: true, KVEventsReplay: true, Tags: []string{"kvrouting-e2e"},
		Config: "block_size        = 16"}.HCL()
}

// router is the gateway wired for KV-aware routing, in process.
type router struct {
	url   string
	pool  *discovery.Pool
	cache *cachestate.State
	doc   *policy.Document
}

func enginesOf(ws []*scoring.Worker) []cachestate.Engine {
	out := make([]cachestate.Engine, 0, len(ws))
	for _, w := range ws {
		out = append(out, cachestate.Engine{ID: w.ID, Model: w.Model, Address: w.Address, BlockSize: w.BlockSize,
			KVEvents: w.KVEventsEndpoint, KVEventsReplay: w.KVEventsReplay, Node: w.Node})
	}
	return out
}

func startRouter(t *testing.T, ctx context.Context, doc *policy.Document) *router {
	log := hclog.New(&hclog.LoggerOptions{Name: "kvrouting-e2e", Level: hclog.Warn})
	m := metrics.New(prometheus.NewRegistry())
	cache := cachestate.New(cachestate.Config{Logger: log.Named("cachestate")})
	t.Cleanup(func() { must.NoError(t, cache.Close()) })
	pool := discovery.New(discovery.Config{})
	pool.OnChange(func(ws []*scoring.Worker) { cache.Sync(ctx, enginesOf(ws)) })
	src := &discovery.Consul{Client: stack.Consul, Service: discovery.EngineService, Tag: "kvrouting-e2e", Logger: log, Metrics: m, WaitTime: 5 * time.Second}
	go src.Run(ctx, pool)

	tok := tokens.NewAuto(func(model string) []tokens.Replica {
		var out []tokens.Replica
		for _, w := range pool.Workers(model) {
			out = append(out, tokens.Replica{Address: w.Address, Engine: w.Engine})
		}
		return out
	}, nil)
	reg, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.NewPrefixTerm(cache))...)
	must.NoError(t, err)
	must.NoError(t, doc.Validate(reg))
	gw, err := gateway.New(gateway.Config{Pool: pool, Policy: gateway.StaticPolicy{Doc: doc}, Selector: scoring.NewSelector(scoring.SelectorConfig{Registry: reg}),
		Admission: admission.New(), Metrics: m, Logger: log, Prepare: tok.Prepare})
	must.NoError(t, err)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &router{url: srv.URL, pool: pool, cache: cache, doc: doc}
}

// engineCounters scrapes every engine's own metrics: address → family → value.
func engineCounters(t *testing.T, ws []*scoring.Worker) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, w := range ws {
		resp, err := http.Get("http://" + w.Address + "/metrics")
		must.NoError(t, err)
		parser := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		must.NoError(t, err)
		vals := map[string]float64{}
		for name, f := range fams {
			for _, mm := range f.GetMetric() {
				switch {
				case mm.GetCounter() != nil:
					vals[name] += mm.GetCounter().GetValue()
				case mm.GetGauge() != nil:
					vals[name] += mm.GetGauge().GetValue()
				}
			}
		}
		out[w.Address] = vals
	}
	return out
}

func chat(t *testing.T, url, system, question string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, modelName, system, question)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
	must.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode, must.Sprintf("body: %s", b))
}

func systemPrompt(tag string) string {
	var b strings.Builder
	for i := 0; b.Len() < 3000; i++ {
		fmt.Fprintf(&b, "Rule %d of the %s assistant: answer precisely, cite the policy, never guess. ", i, tag)
	}
	return b.String()
}

type burstResult struct {
	hits, queries map[string]float64 // per engine address, deltas
	requests      map[string]float64
}

// burst sends one warm-up request with the shared system prompt, waits until
// the router's cache state knows a holder, then n requests sharing it, and
// returns each engine's deltas of its own counters.
func burst(t *testing.T, r *router, tag string, n int) burstResult {
	ws := r.pool.Workers(modelName)
	before := engineCounters(t, ws)
	system := systemPrompt(tag)
	chat(t, r.url, system, "warm-up question")
	// Wait for the holder's BlockStored events to reach the index, as a
	// follow-up request would in steady state.
	toks, err := tokens.Sim{}.Tokenize(context.Background(), modelName,
		openai.Prompt{Chat: true, Messages: []byte(fmt.Sprintf(`[{"role":"system","content":%q}]`, system))})
	must.NoError(t, err)
	keys, err := r.cache.Keys(nil, modelName, 16, toks[:len(toks)/2])
	must.NoError(t, err)
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, "the router to index every block of the prompt's first half", func() bool {
		for _, m := range r.cache.Match(keys, prefixindex.DefaultTierWeights(), nil) {
			if m.Blocks == len(keys) {
				return true
			}
		}
		return false
	})
	for i := 0; i < n; i++ {
		chat(t, r.url, system, fmt.Sprintf("question number %d about %s", i, tag))
	}
	after := engineCounters(t, ws)
	res := burstResult{hits: map[string]float64{}, queries: map[string]float64{}, requests: map[string]float64{}}
	for addr := range after {
		res.hits[addr] = after[addr]["vllm:prefix_cache_hits_total"] - before[addr]["vllm:prefix_cache_hits_total"]
		res.queries[addr] = after[addr]["vllm:prefix_cache_queries_total"] - before[addr]["vllm:prefix_cache_queries_total"]
		res.requests[addr] = after[addr]["vllm:request_success_total"] - before[addr]["vllm:request_success_total"]
	}
	return res
}

func sum(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

func TestSharedPrefixBurstGoesToHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for i := 1; i <= 3; i++ {
		id := "kvsim" + strconv.Itoa(i)
		_, err := stack.RunJobHCL(ctx, engineJob(id))
		must.NoError(t, err)
		t.Cleanup(func() { _ = stack.StopJob(context.Background(), id) })
	}
	for i := 1; i <= 3; i++ {
		_, err := stack.WaitAllocsRunning(ctx, "kvsim"+strconv.Itoa(i))
		must.NoError(t, err)
	}

	const n = 9
	kv := policy.Default()
	kv.Policy, kv.Weights = scoring.Weighted, map[string]float64{"prefix": 1, "load": 0.2}
	rkv := startRouter(t, ctx, kv)
	testutil.EventuallyEvery(t, 90*time.Second, 200*time.Millisecond, "three workers in the kv-aware router's pool", func() bool {
		ws := rkv.pool.Workers(modelName)
		if len(ws) != 3 {
			return false
		}
		for _, w := range ws {
			if w.KVEventsEndpoint == "" || !rkv.cache.EventDriven(w.ID) {
				return false
			}
		}
		return true
	})
	// The subscribers dial in the background: give each a batch to prove it
	// is connected before measuring (a PUB socket drops what precedes the
	// connection).
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		for _, w := range rkv.pool.Workers(modelName) {
			if st, _ := rkv.cache.EngineStats(w.ID); st.Batches == 0 {
				// Straight to the engine, not through the router.
				// Long enough to fill whole blocks: only full blocks make events.
				body := fmt.Sprintf(`{"model":%q,"prompt":"connect %d %s","max_tokens":1}`, modelName, time.Now().UnixNano(), strings.Repeat("warm up the event stream ", 20))
				if resp, err := http.Post("http://"+w.Address+"/v1/completions", "application/json", strings.NewReader(body)); err == nil {
					resp.Body.Close()
				}
				return false
			}
		}
		return true
	}), wait.Timeout(30*time.Second), wait.Gap(300*time.Millisecond)), must.Func(func() string {
		var b strings.Builder
		for _, w := range rkv.pool.Workers(modelName) {
			st, _ := rkv.cache.EngineStats(w.ID)
			fmt.Fprintf(&b, "%s %s events %s: %+v\n", w.ID, w.Address, w.KVEventsEndpoint, st)
		}
		return b.String()
	}))

	kvRes := burst(t, rkv, "billing", n)

	rr := policy.Default()
	rr.Policy, rr.Weights = scoring.RoundRobin, nil
	rrr := startRouter(t, ctx, rr)
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "three workers in the round-robin router's pool", func() bool { return len(rrr.pool.Workers(modelName)) == 3 })
	rrRes := burst(t, rrr, "shipping", n) // a fresh prompt: cold on every engine

	t.Logf("kv-aware:    hits %v requests %v", kvRes.hits, kvRes.requests)
	t.Logf("round_robin: hits %v requests %v", rrRes.hits, rrRes.requests)

	// KV-aware: the holder served the whole burst and its own counter shows
	// every follow-up hitting the shared prefix.
	var holder string
	for addr, reqs := range kvRes.requests {
		if reqs >= n+1 {
			holder = addr
		}
	}
	must.NotEq(t, "", holder, must.Sprintf("no engine served warm-up and burst: %v", kvRes.requests))
	must.Eq(t, sum(kvRes.hits), kvRes.hits[holder])
	// Round robin spread the same burst over all three engines, two of which
	// had to compute the shared prompt from scratch.
	for addr, reqs := range rrRes.requests {
		must.Positive(t, reqs, must.Sprintf("engine %s got no request under round_robin", addr))
	}
	must.Greater(t, sum(rrRes.hits), sum(kvRes.hits), must.Sprintf("kv-aware hits %v vs round_robin %v", sum(kvRes.hits), sum(rrRes.hits)))
	kvMiss := sum(kvRes.queries) - sum(kvRes.hits)
	rrMiss := sum(rrRes.queries) - sum(rrRes.hits)
	t.Logf("prompt tokens computed: kv-aware %.0f, round_robin %.0f", kvMiss, rrMiss)
	must.Less(t, rrMiss, kvMiss)

	// The replay path end to end: the driver rendered replay_endpoint from
	// kv_events_replay_port, the engine serves its buffer where the service
	// meta says, discovery read it, and no engine had to be resynchronised.
	for _, w := range rkv.pool.Workers(modelName) {
		must.NotEq(t, "", w.KVEventsReplay, must.Sprintf("%s advertises no oasis_kv_events_replay", w.ID))
		ep, err := cachestate.ResolveEndpoint(w.KVEventsReplay, w.Address)
		must.NoError(t, err)
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := kvevents.Replay(rctx, ep, "", 0)
		rcancel()
		must.NoError(t, err, must.Sprintf("replaying %s at %s", w.ID, ep))
		must.Positive(t, len(got), must.Sprintf("%s replayed no batch", w.ID))
		st, _ := rkv.cache.EngineStats(w.ID)
		must.Eq(t, int64(0), st.Resyncs, must.Sprintf("%s: %+v", w.ID, st))
	}
}
