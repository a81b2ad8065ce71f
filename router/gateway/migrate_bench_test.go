package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/sim/engine"
	simserver "github.com/oasis-llm/oasis/sim/server"
)

// idsEngine streams 16 tokens as vLLM does with return_token_ids: the
// first chunk has the prompt's ids, every chunk its token's id.
func idsEngine() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","prompt_token_ids":[128000,128006,882,128007,271,15339,128009,128006,78191,128007,271],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n")
		for i := range 16 {
			fmt.Fprintf(w, `data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":null,"token_ids":[%d]}]}`+"\n\n", i, 1000+i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, `data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":16,"total_tokens":27}}`+"\n\ndata: [DONE]\n\n")
	}))
}

// BenchmarkProxyStreamingTokenIDs is the router's per-request cost for a
// 16-token stream from an engine that returns token ids: migrate keeps
// them (parsing every event), off is migration_limit 0 (bytes relayed as
// they come). The difference is what keeping a stream migratable costs.
func BenchmarkProxyStreamingTokenIDs(b *testing.B) {
	e := idsEngine()
	defer e.Close()
	for _, tc := range []struct {
		name  string
		limit int
	}{{"migrate", policy.DefaultMigrationLimit}, {"off", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			limit := tc.limit
			doc := &policy.Document{Policy: scoring.RoundRobin, MigrationLimit: &limit}
			h := engineHarness(b, Config{}, "vllm", doc, map[string]string{"a": "m@" + addr(e)})
			benchStream(b, h.srv.URL)
		})
	}
}

// BenchmarkMigration measures what a migration costs a stream between two
// oasis-sim engines at real-time speed (Llama-3-8B on an H100's step
// times): a 9,000-character prompt (3,601 tokens to oasis-sim's tokenizer), 64
// tokens, the first engine cut after 32.
// It reports the gap at the cut less the stream's median gap between two
// tokens (added-ms), the tokens resent and, of them, those the new engine
// had cached (its usage's cached_tokens): cold, the new engine never saw
// the prompt; warm, it had served it before.
func BenchmarkMigration(b *testing.B) {
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 200)
	body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":64,"seed":1,"stream":true,"stream_options":{"include_usage":true}}`, prompt)
	for _, warm := range []bool{false, true} {
		name := map[bool]string{false: "cold", true: "warm"}[warm]
		b.Run(name, func(b *testing.B) {
			var added, resent, cached []float64
			for range b.N {
				b.StopTimer()
				simA, simB := startBenchSim(b), startBenchSim(b)
				bad := newFaultyEngine(b, simA, 32, crashFault) // a completion stream: one token per event
				good := newFaultyEngine(b, simB, -1, crashFault)
				if warm {
					resp, err := http.Post("http://"+simB+"/v1/completions", "application/json",
						strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":1}`, prompt)))
					must.NoError(b, err)
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				h := engineHarness(b, Config{MaxBodyBytes: 1 << 20}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
				b.StartTimer()
				gaps, c := timedStream(b, h.srv.URL+"/v1/completions", body)
				b.StopTimer()
				med := median(append([]float64(nil), gaps...))
				added = append(added, gaps[31]-med) // between token 32 (first engine) and 33 (the new one)
				resent = append(resent, promtestValue(h))
				cached = append(cached, float64(c))
			}
			b.ReportMetric(median(added), "added-ms")
			b.ReportMetric(median(resent), "resent-tokens")
			b.ReportMetric(median(cached), "cached-tokens")
		})
	}
}

func promtestValue(h *harness) float64 {
	var v float64
	mfs, _ := h.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "oasis_router_migration_resent_tokens_total" {
			v = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return v
}

// startBenchSim serves an oasis-sim at real-time speed with the default
// step times and a block pool large enough for the bench's prompts.
func startBenchSim(b *testing.B) string {
	s, err := simserver.New(simserver.Config{Model: "org/m", ServedModelNames: []string{"m"}, MaxModelLen: 8192,
		Version: "bench", Speed: 1, Engine: engine.Config{BlockSize: 16, NumGPUBlocks: 4000, Timing: engine.DefaultTiming()}})
	must.NoError(b, err)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = s.Run(ctx); close(done) }()
	ts := httptest.NewServer(s.Handler())
	b.Cleanup(func() { ts.Close(); cancel(); <-done; _ = s.Close() })
	return addr(ts)
}

// timedStream reads a completion stream and returns the gaps in ms
// between its text events and the cached_tokens of its usage.
func timedStream(b *testing.B, url, body string) ([]float64, int) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	must.NoError(b, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var (
		gaps   []float64
		last   time.Time
		cached int
	)
	for {
		line, err := br.ReadString('\n')
		if data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok && data != "[DONE]" {
			var c struct {
				Choices []struct{ Text string } `json:"choices"`
				Usage   *struct {
					Details struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			must.NoError(b, json.Unmarshal([]byte(data), &c))
			if c.Usage != nil {
				cached = c.Usage.Details.Cached
			}
			if len(c.Choices) > 0 && c.Choices[0].Text != "" {
				now := time.Now()
				if !last.IsZero() {
					gaps = append(gaps, float64(now.Sub(last).Microseconds())/1000)
				}
				last = now
			}
		}
		if err != nil {
			break
		}
	}
	must.SliceLen(b, 63, gaps)
	return gaps, cached
}

func median(v []float64) float64 {
	sort.Float64s(v)
	return v[len(v)/2]
}
