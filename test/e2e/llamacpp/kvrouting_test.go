package llamacpp

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// reuse is what one burst of shared-prefix chats cost the engines, by their own account.
type reuse struct {
	prompt, cached int // prompt tokens of the follow-ups, and how many llama-server took from its cache
	cold           int // follow-ups that found none of the shared prefix cached
	perEngine      map[string]float64
}

func (r reuse) ratio() float64 { return float64(r.cached) / float64(r.prompt) }

func sharedSystem(tag string) string {
	var b strings.Builder
	for i := 0; b.Len() < 2500; i++ {
		fmt.Fprintf(&b, "Rule %d of the %s desk: answer precisely, cite the policy, never guess. ", i, tag)
	}
	return b.String()
}

// burst sends one chat with a long system prompt, then n chats sharing it, through the
// router at url, one at a time, and sums llama-server's timings of the follow-ups:
// prompt_n + cache_n is the prompt, cache_n what the slot already held.
func burst(t *testing.T, url, model string, addrs []string, tag string, n int) reuse {
	t.Helper()
	system := sharedSystem(tag)
	before := map[string]map[string]float64{}
	for _, a := range addrs {
		before[a] = scrape(t, a)
	}
	ask := func(q string) chatAnswer {
		var out chatAnswer
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"system","content":%s},{"role":"user","content":%s}]}`,
			model, strconv.Quote(system), strconv.Quote(q))
		code, b := post(t, url+"/v1/chat/completions", body, &out)
		must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
		must.Eq(t, out.Timings.CacheN, out.Usage.PromptTokensDetails.CachedTokens)
		return out
	}
	warm := ask("warm-up question for " + tag)
	must.Greater(t, 500, warm.Usage.PromptTokens)
	var r reuse
	for i := 0; i < n; i++ {
		a := ask(fmt.Sprintf("question %d about %s", i, tag))
		r.prompt += a.Usage.PromptTokens
		r.cached += a.Timings.CacheN
		if a.Timings.CacheN < warm.Usage.PromptTokens/2 {
			r.cold++
		}
	}
	r.perEngine = map[string]float64{}
	for _, a := range addrs {
		r.perEngine[a] = scrape(t, a)["llamacpp:prompt_tokens_total"] - before[a]["llamacpp:prompt_tokens_total"]
	}
	return r
}

// KV-aware routing without KV events, measured with llama-server's own counters: three
// engines publish no cache events, so the router models their caches from its own
// decisions. A burst sharing a long system prompt through the default policy goes to the
// engine that holds it and every follow-up is served from its slot cache; through
// round_robin the same burst lands on engines that must compute the prefix first.
func TestSharedPrefixReuseWithoutKVEvents(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	const model, n = "tiny-kv", 9
	addrs := runEngines(t, ctx, "llama-kv", model, 3)

	def := burst(t, startRouter(t, policy.Default(), model), model, addrs, "billing", n)
	rr := policy.Default()
	rr.Policy, rr.Weights = scoring.RoundRobin, nil
	rrRes := burst(t, startRouter(t, rr, model), model, addrs, "shipping", n) // a fresh prefix: cold everywhere

	t.Logf("default policy: %d of %d follow-up prompt tokens from llama-server's cache (%.2f), %d cold; prompt tokens computed per engine %v",
		def.cached, def.prompt, def.ratio(), def.cold, def.perEngine)
	t.Logf("round_robin:    %d of %d follow-up prompt tokens from llama-server's cache (%.2f), %d cold; prompt tokens computed per engine %v",
		rrRes.cached, rrRes.prompt, rrRes.ratio(), rrRes.cold, rrRes.perEngine)
	t.Logf("cache reuse, default / round_robin: %.2f", def.ratio()/rrRes.ratio())

	must.Eq(t, 0, def.cold, must.Sprint("a follow-up under the default policy missed the holder's cache"))
	must.GreaterEq(t, 2, rrRes.cold, must.Sprint("round_robin should send follow-ups to the two engines without the prefix"))
	must.Greater(t, rrRes.ratio(), def.ratio())
}
