package federation

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

// prefixPolicy: the prefix term decides the local worker (so the router
// knows the prompt's block keys and what its own worker holds); no
// admission cap, so neither datacenter is ever saturated and the prefix
// rule (c) is the only reason a request may leave.
const prefixPolicy = `{"policy":"weighted","weights":{"prefix":1,"load":0.1},
  "federation":{"enabled":true,"margin":"50ms","max_spill_fraction":1,"resume_spill_fraction":0.5}}`

// prefillStep is each sim's step time per uncached prompt token: 200 µs is
// 5,000 tokens/s, ~7× slower than the simulator's default, so that the
// saving of a cached long prompt dwarfs loopback's round trip while a short
// prompt's stays under the margin. The numbers, with rate r ≈ 5,000 tok/s
// as dc1's router measures it (first token time over uncached tokens):
//
//	long prompt,  ~3,000 tokens: saving ≈ 3000/r ≈ 600 ms ≫ RTT (~1 ms) + margin (50 ms)
//	short prompt,    ~80 tokens: saving ≈   80/r ≈  16 ms <  margin (50 ms)
//
// so the long one is forwarded for its prefix and the short one is not, by
// a factor of ~3 or more on each side of the threshold.
const prefillStep = "200us"

// usageOf is a usage field of a stream's usage object (cached_tokens is
// under prompt_tokens_details), or 0.
func usageOf(body, field string) int {
	for _, line := range strings.Split(body, "\n") {
		ev, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.Contains(ev, `"usage":{`) {
			continue
		}
		var u struct {
			Usage map[string]json.RawMessage `json:"usage"`
		}
		if json.Unmarshal([]byte(ev), &u) != nil {
			continue
		}
		var n int
		if raw, ok := u.Usage[field]; ok && json.Unmarshal(raw, &n) == nil {
			return n
		}
		var d map[string]int
		_ = json.Unmarshal(u.Usage["prompt_tokens_details"], &d)
		return d[field]
	}
	return 0
}

// words is a prompt of n distinct words that starts with tag: prompts with
// different tags share no block.
func words(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%d ", tag, i)
	}
	return b.String()
}

// A long prompt warmed in dc2 is sent there from dc1 for its prefix; a
// short prompt warmed there too is served in dc1, its saving being under
// the margin.
func TestFederationPrefix(t *testing.T) {
	c1, c2 := testutil.StartConsulWAN(t)
	ca := tlsfilestest.NewCA(t, "federation")
	o := dcOpts{policy: prefixPolicy, engines: 1, simArgs: []string{"--step-time-per-prefill-token", prefillStep}}
	dc1, dc2 := startDCWith(t, "dc1", c1, ca, o), startDCWith(t, "dc2", c2, ca, o)
	for _, d := range []*dc{dc1, dc2} {
		testutil.Eventually(t, 30*time.Second, d.name+" to receive a summary", func() bool {
			return d.metric(t, "oasis_router_federation_summary_age_seconds", nil) > 0
		})
	}
	prefixFwd := func() float64 {
		return dc1.metric(t, "oasis_router_federation_forwarded_total", map[string]string{"dc": "dc2", "reason": "prefix"})
	}
	send := func(d *dc, prompt string) {
		t.Helper()
		t0 := time.Now()
		resp, body := d.chatPrompt(t, prompt, 4)
		must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
		checkStream(t, body)
		t.Logf("%s: %d prompt tokens, %d cached, answered in %v", d.name, usageOf(body, "prompt_tokens"),
			usageOf(body, "cached_tokens"), time.Since(t0).Round(time.Millisecond))
	}
	// dc1's router learns its worker's prefill rate from a long prompt of
	// its own (until then it assumes a fast GPU, and savings look small).
	send(dc1, words("calibrate", 1000))
	long, short := words("long", 1000), words("short", 25)
	send(dc2, long)
	send(dc2, short)
	dc1.waitSummaries(t, "dc2", 2) // dc2's summaries since carry the two prefixes

	before := prefixFwd()
	send(dc1, short)
	must.Eq(t, before, prefixFwd(), must.Sprint("the short prompt is served in dc1"))
	send(dc1, long)
	must.Eq(t, before+1, prefixFwd(), must.Sprint("the long prompt goes to dc2 for its prefix"))
}
