package federation

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

// wanPair is two datacenters whose routers reach each other only through
// relays inside a network namespace: to1 in front of dc1's federation
// listener, to2 in front of dc2's. Consul's own WAN traffic stays on
// loopback: only the routers' link is cut or slowed.
type wanPair struct {
	link     *wanLink
	dc1, dc2 *dc
	to1, to2 *relay
}

func startWANPair(t *testing.T, policy string, dc1NoEngine bool) *wanPair {
	t.Helper()
	p := &wanPair{link: newWANLink(t)}
	c1, c2 := testutil.StartConsulWAN(t)
	ca := tlsfilestest.NewCA(t, "federation")
	l1, l2 := testutil.FreeAddr(t), testutil.FreeAddr(t)
	p.to1, p.to2 = startRelay(t, p.link.listenUDP(t), l1), startRelay(t, p.link.listenUDP(t), l2)
	// Peers dial the relays' address in the namespace: it is in both certificates.
	hosts := []string{p.link.nsIP}
	dc1Engines := 1
	if dc1NoEngine {
		dc1Engines = 0
	}
	p.dc1 = startDCWith(t, "dc1", c1, ca, dcOpts{policy: policy, engines: dc1Engines, listen: l1, advertise: p.to1.Addr(), hosts: hosts})
	p.dc2 = startDCWith(t, "dc2", c2, ca, dcOpts{policy: policy, engines: 1, listen: l2, advertise: p.to2.Addr(), hosts: hosts})
	for _, d := range []*dc{p.dc1, p.dc2} {
		testutil.Eventually(t, 30*time.Second, d.name+" to receive a summary", func() bool {
			return d.metric(t, "oasis_router_federation_summary_age_seconds", nil) > 0
		})
	}
	return p
}

// sseEvent is one data line of a stream and when it arrived.
type sseEvent struct {
	at   time.Time
	data string
}

// openStream starts a streaming chat on d; its events arrive on the
// channel, closed at the body's end. The request gives up after limit, so
// a hung stream fails the test instead of blocking it.
func (d *dc) openStream(t *testing.T, maxTokens int, limit time.Duration) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hello federation"}],` +
		`"stream":true,"max_tokens":` + strconv.Itoa(maxTokens) + `}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", strings.NewReader(body))
	must.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	ch := make(chan sseEvent, 1024)
	go func() {
		defer cancel()
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				ch <- sseEvent{time.Now(), data}
			}
		}
	}()
	return ch
}

// timedChat is chat with its duration.
func (d *dc) timedChat(t *testing.T) (int, time.Duration) {
	t.Helper()
	t0 := time.Now()
	resp, _ := d.chat(t, 4)
	return resp.StatusCode, time.Since(t0)
}

// cutPolicy: dc1's requests all go to dc2 (dc1 has no engine); a stream
// silent for 2 s ends; a summary older than 3 s makes dc2 unusable; one
// failure opens the breaker. The model is in the policy, so dc1 answers
// 503, not 404, when dc2 is unusable.
const cutPolicy = `{"policy":"round_robin","timeouts":{"stream_idle":"2s"},"models":{"` + model + `":{}},
  "federation":{"enabled":true,"max_spill_fraction":1,"resume_spill_fraction":0.5,
  "summary_stale":"3s","breaker_failures":1,"breaker_cooldown":"2s"}}`

// TestWANCut cuts the routers' link silently (every packet dropped in the
// namespace, both ways) between requests and in the middle of a forwarded
// stream: nothing hangs, dc1 stops choosing dc2, and forwarding resumes
// when the link returns.
func TestWANCut(t *testing.T) {
	p := startWANPair(t, cutPolicy, true)
	fwd := func() float64 {
		return p.dc1.metric(t, "oasis_router_federation_forwarded_total", map[string]string{"dc": "dc2"})
	}
	resp, body := p.dc1.chat(t, 8)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
	checkStream(t, body)
	must.Eq(t, 1.0, fwd())

	t.Run("between requests", func(t *testing.T) {
		p.link.cut(t)
		cutAt := time.Now()
		// The summary is still fresh: the request is forwarded into the cut
		// and must come back, failed over to a local answer (none: 503).
		code, took := p.dc1.timedChat(t)
		t.Logf("first request after the cut: %d in %v", code, took.Round(time.Millisecond))
		must.Eq(t, http.StatusServiceUnavailable, code)
		must.Less(t, 10*time.Second, took)
		p.waitUnusable(t, cutAt)
		p.restoreAndResume(t)
	})

	t.Run("mid-stream", func(t *testing.T) {
		before := fwd()
		// About 20 s of tokens at the sim's pace: the cut lands mid-stream.
		events := p.dc1.openStream(t, 3000, 60*time.Second)
		for range 10 {
			ev, ok := <-events
			must.True(t, ok, must.Sprint("the stream ended before the cut"))
			must.StrNotContains(t, ev.data, `"error"`)
		}
		must.Eq(t, before+1, fwd())
		p.link.cut(t)
		cutAt := time.Now()
		var errAt, endAt time.Time
		var last string
		for ev := range events {
			last = ev.data
			if errAt.IsZero() && strings.Contains(ev.data, `"error"`) {
				errAt = ev.at
			}
		}
		endAt = time.Now()
		must.False(t, errAt.IsZero(), must.Sprintf("no error event; last event %q", last))
		t.Logf("after the cut: error event in %v, stream closed in %v", errAt.Sub(cutAt).Round(time.Millisecond),
			endAt.Sub(cutAt).Round(time.Millisecond))
		// stream_idle is 2 s; the QUIC idle timeout (5 s) is the backstop.
		must.Less(t, 7*time.Second, errAt.Sub(cutAt))
		must.Less(t, 8*time.Second, endAt.Sub(cutAt))
		p.waitUnusable(t, cutAt)
		p.restoreAndResume(t)
	})
}

// waitUnusable waits until dc1 holds dc2's summary stale, then checks a new
// request is answered at once (503: dc1 has no engine).
func (p *wanPair) waitUnusable(t *testing.T, cutAt time.Time) {
	t.Helper()
	// summary_stale (3 s), a push timeout (1 s) and slack.
	testutil.Eventually(t, 8*time.Second, "dc2's summary to go stale in dc1", func() bool {
		return p.dc1.metric(t, "oasis_router_federation_summary_age_seconds", map[string]string{"dc": "dc2"}) > 3
	})
	breaker := p.dc1.metric(t, "oasis_router_federation_breaker_state", map[string]string{"dc": "dc2"})
	t.Logf("dc2 stale in dc1 %v after the cut (breaker state %v)", time.Since(cutAt).Round(100*time.Millisecond), breaker)
	code, took := p.dc1.timedChat(t)
	t.Logf("request with dc2 unusable: %d in %v", code, took.Round(time.Millisecond))
	must.Eq(t, http.StatusServiceUnavailable, code)
	must.Less(t, time.Second, took)
}

// restoreAndResume lifts the cut and waits for a request forwarded whole.
func (p *wanPair) restoreAndResume(t *testing.T) {
	t.Helper()
	p.link.restore(t)
	up := time.Now()
	var body string
	testutil.Eventually(t, 20*time.Second, "forwarding to resume", func() bool {
		var resp *http.Response
		resp, body = p.dc1.chat(t, 8)
		return resp.StatusCode == http.StatusOK
	})
	checkStream(t, body)
	t.Logf("forwarding resumed %v after the link returned", time.Since(up).Round(100*time.Millisecond))
}

// latencyPolicy: the weighted policy (its prefix term gives the federation
// the prompt's block keys); a prefix saving must beat the extra round trip
// by 20 ms.
const latencyPolicy = `{"policy":"weighted","weights":{"ttft":2,"prefix":1,"load":0.2},
  "federation":{"enabled":true,"max_spill_fraction":1,"resume_spill_fraction":0.5,"margin":"20ms"}}`

// TestWANLatencyFlipsDecision: a long prompt (10k tokens: 200-300 ms of
// prefill at 33-50k tokens/s) cached in dc2 only. Over a fast link dc1
// forwards it there (the prefill it saves beats the round trip); with
// 250 ms added each way the round trip costs more than the saving and dc1
// serves the same request itself.
func TestWANLatencyFlipsDecision(t *testing.T) {
	p := startWANPair(t, latencyPolicy, false)
	var sb strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&sb, "w%d ", i)
	}
	prompt := sb.String()
	resp, body := p.dc2.chatPrompt(t, prompt, 4)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
	t.Logf("dc2 served the prompt: %d prompt tokens, %d cached", usageOf(body, "prompt_tokens"), usageOf(body, "cached_tokens"))
	fwd := func() float64 {
		return p.dc1.metric(t, "oasis_router_federation_forwarded_total", map[string]string{"dc": "dc2", "reason": "prefix"})
	}
	// dc2's summaries since carry the prompt's blocks in their filter.
	p.dc1.waitSummaries(t, "dc2", 2)

	rtt := p.dc1.rttWindow(t, 3)
	t.Logf("fast link: dc1's measured RTT to dc2 %v", rtt)
	resp, body = p.dc1.chatPrompt(t, prompt, 4)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
	must.Eq(t, 1.0, fwd(), must.Sprint("forwarded for its prefix"))

	p.to1.SetDelay(250 * time.Millisecond)
	p.to2.SetDelay(250 * time.Millisecond)
	// The router smooths the RTT (7/8 old): 15 pushes bring it within
	// 15% of the new round trip.
	rtt = p.dc1.rttWindow(t, 15)
	t.Logf("slow link: dc1's measured RTT to dc2 %v", rtt)
	must.Greater(t, 400*time.Millisecond, rtt)
	// dc2 is still usable: only the round trip has changed.
	must.Less(t, 3, p.dc1.metric(t, "oasis_router_federation_summary_age_seconds", map[string]string{"dc": "dc2"}))
	must.Eq(t, 0, p.dc1.metric(t, "oasis_router_federation_breaker_state", map[string]string{"dc": "dc2"}))
	resp, body = p.dc1.chatPrompt(t, prompt, 4)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
	must.Eq(t, 1.0, fwd(), must.Sprint("served locally"))
	t.Logf("dc1 served it: %d prompt tokens, %d cached", usageOf(body, "prompt_tokens"), usageOf(body, "cached_tokens"))
}

// rttWindow waits for n more RTT samples of dc1's pushes to dc2 and
// returns their mean (oasis_router_federation_rtt_seconds).
func (d *dc) rttWindow(t *testing.T, n int) time.Duration {
	t.Helper()
	c0, s0 := d.histogram(t, "oasis_router_federation_rtt_seconds", "dc2")
	var c1 uint64
	var s1 float64
	testutil.Eventually(t, time.Duration(n+5)*2*time.Second, "RTT samples", func() bool {
		c1, s1 = d.histogram(t, "oasis_router_federation_rtt_seconds", "dc2")
		return c1 >= c0+uint64(n)
	})
	return time.Duration((s1 - s0) / float64(c1-c0) * float64(time.Second)).Round(100 * time.Microsecond)
}

// histogram returns the sample count and sum of a histogram's dc series.
func (d *dc) histogram(t *testing.T, name, dcLabel string) (uint64, float64) {
	t.Helper()
	mfs, err := d.reg.Gather()
	must.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "dc" && l.GetValue() == dcLabel {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}
