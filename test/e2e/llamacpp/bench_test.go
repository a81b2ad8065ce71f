package llamacpp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// BenchmarkSharedPrefixTTFT is the real-engine routing figure (BENCHMARKS.md "Real engines"):
// four llama-server engines launched by the llm driver, no KV events, four tenants each with
// its own ~630-token system prompt, one client per tenant sending a warm-up chat and then
// followUps chats that share it, the four clients at once. The default policy and round_robin
// serve the same workload (fresh prompts for each, so both start cold) in the same run; the
// figures are the follow-ups' time to first token, measured by the client on the streamed
// answer, and the prompt tokens llama-server took from its slot caches (its own timings).
//
//	make bench-llamacpp
func BenchmarkSharedPrefixTTFT(b *testing.B) {
	const model, engines, tenants, followUps = "tiny-bench", 4, 4, 8
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	addrs := runEngines(b, ctx, "llama-bench", model, engines)
	rr := policy.Default()
	rr.Policy, rr.Weights = scoring.RoundRobin, nil
	for i := 0; i < b.N; i++ {
		def := ttftRun(b, startRouter(b, policy.Default(), model), model, fmt.Sprintf("default-%d", i), tenants, followUps)
		rrRun := ttftRun(b, startRouter(b, rr, model), model, fmt.Sprintf("rr-%d", i), tenants, followUps)
		for _, r := range []struct {
			name string
			ttftResult
		}{{"default", def}, {"round_robin", rrRun}} {
			b.Logf("%-11s TTFT p50 %v p90 %v over %d follow-ups on %d engines; %d of %d follow-up prompt tokens from the engines' caches (%.2f)",
				r.name, r.p(50), r.p(90), len(r.ttfts), len(addrs), r.cached, r.prompt, r.reuse())
		}
		b.ReportMetric(float64(def.p(50).Microseconds())/1000, "default-p50-ms")
		b.ReportMetric(float64(def.p(90).Microseconds())/1000, "default-p90-ms")
		b.ReportMetric(float64(rrRun.p(50).Microseconds())/1000, "rr-p50-ms")
		b.ReportMetric(float64(rrRun.p(90).Microseconds())/1000, "rr-p90-ms")
		b.ReportMetric(def.reuse(), "default-reuse")
		b.ReportMetric(rrRun.reuse(), "rr-reuse")
	}
}

type ttftResult struct {
	ttfts          []time.Duration
	prompt, cached int
}

func (r ttftResult) p(q int) time.Duration {
	s := slices.Clone(r.ttfts)
	slices.Sort(s)
	return s[(len(s)-1)*q/100]
}

func (r ttftResult) reuse() float64 { return float64(r.cached) / float64(r.prompt) }

// ttftRun sends each tenant's warm-up and follow-ups through the router at url, the tenants
// at once, and collects the follow-ups' figures.
func ttftRun(b *testing.B, url, model, tag string, tenants, followUps int) ttftResult {
	var mu sync.Mutex
	var res ttftResult
	var wg sync.WaitGroup
	for tn := range tenants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			system := sharedSystem(fmt.Sprintf("%s tenant %d", tag, tn))
			streamTTFT(b, url, model, system, "warm-up question")
			for i := range followUps {
				ttft, prompt, cached := streamTTFT(b, url, model, system, fmt.Sprintf("question %d", i))
				mu.Lock()
				res.ttfts = append(res.ttfts, ttft)
				res.prompt += prompt
				res.cached += cached
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return res
}

// streamTTFT sends one streamed chat and returns the time to its first content chunk, its
// prompt tokens and those llama-server took from the slot's cache (timings.cache_n).
func streamTTFT(b *testing.B, url, model, system, user string) (time.Duration, int, int) {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":%s},{"role":"user","content":%s}]}`,
		model, strconv.Quote(system), strconv.Quote(user))
	start := time.Now()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(b, err)
	defer resp.Body.Close()
	must.Eq(b, http.StatusOK, resp.StatusCode)
	var ttft time.Duration
	var prompt, cached int
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
			Timings *struct {
				CacheN int `json:"cache_n"`
			} `json:"timings"`
		}
		must.NoError(b, json.Unmarshal([]byte(data), &ev), must.Sprint(data))
		for _, c := range ev.Choices {
			if ttft == 0 && c.Delta.Content != nil && *c.Delta.Content != "" {
				ttft = time.Since(start)
			}
		}
		if ev.Usage != nil {
			prompt = ev.Usage.PromptTokens
		}
		if ev.Timings != nil {
			cached = ev.Timings.CacheN
		}
	}
	must.NoError(b, sc.Err())
	must.Positive(b, ttft, must.Sprint("no content streamed"))
	return ttft, prompt, cached
}
