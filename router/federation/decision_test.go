package federation

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/policy"
)

func TestDecide(t *testing.T) {
	on := policy.DefaultFederation()
	on.Enabled = true
	on.QueueWaitBudget = 2 * time.Second // the cases' waits are set against it
	ms := time.Millisecond
	healthy := Local{Healthy: true, PromptTokens: 8000, CachedTokens: 0, PrefillRate: 10000}
	near := Remote{DC: "dc2", RTT: 20 * ms, TTFT: 100 * ms, Usable: true}
	far := Remote{DC: "dc3", RTT: 150 * ms, TTFT: 100 * ms, Usable: true}
	cached := func(r Remote, n int64) Remote { r.CachedTokens = n; return r }
	unusable := func(r Remote) Remote { r.Usable = false; return r }
	off := on
	off.Enabled = false

	for _, tc := range []struct {
		name      string
		s         policy.FederationSettings
		forwarded bool
		paused    bool
		local     Local
		remotes   []Remote
		want      Decision
	}{
		{name: "off", s: off, local: Local{}, remotes: []Remote{near}, want: Decision{}},
		{name: "healthy local, no saving: local", s: on, local: healthy, remotes: []Remote{near, far}},
		{name: "no local worker: cheapest remote", s: on, local: Local{}, remotes: []Remote{far, near},
			want: Decision{DC: "dc2", Reason: ReasonNoLocalWorker}},
		{name: "no local worker, spill paused: still forwarded", s: on, paused: true, local: Local{},
			remotes: []Remote{far}, want: Decision{DC: "dc3", Reason: ReasonNoLocalWorker}},
		{name: "no local worker, none usable: local (503 there)", s: on, local: Local{},
			remotes: []Remote{unusable(near)}},
		{name: "forwarded once: never again", s: on, forwarded: true, local: Local{}, remotes: []Remote{near}},
		{name: "saturated: cheapest", s: on, local: Local{Healthy: true, Saturated: true}, remotes: []Remote{far, near},
			want: Decision{DC: "dc2", Reason: ReasonSaturated}},
		{name: "saturated, spill paused: local", s: on, paused: true, local: Local{Healthy: true, Saturated: true},
			remotes: []Remote{near}},
		{name: "queue wait over budget, remote cheaper", s: on, local: Local{Healthy: true, QueueWait: 3 * time.Second},
			remotes: []Remote{near}, want: Decision{DC: "dc2", Reason: ReasonSaturated}},
		{name: "queue wait over budget, remote dearer: local", s: on,
			local:   Local{Healthy: true, QueueWait: 3 * time.Second},
			remotes: []Remote{{DC: "dc2", RTT: 20 * ms, QueueWait: 5 * time.Second, Usable: true}}},
		{name: "queue wait under budget: local", s: on, local: Local{Healthy: true, QueueWait: time.Second},
			remotes: []Remote{near}},
		// 8000 cached tokens at 10000 tok/s save 800 ms > 20 ms RTT + 50 ms margin.
		{name: "prefix saving beats RTT", s: on, local: healthy, remotes: []Remote{cached(near, 8000)},
			want: Decision{DC: "dc2", Reason: ReasonPrefix}},
		// 512 tokens save 51.2 ms < 20 ms + 50 ms.
		{name: "prefix saving under RTT + margin: local", s: on, local: healthy, remotes: []Remote{cached(near, 512)}},
		{name: "prefix: largest net gain wins", s: on, local: healthy,
			remotes: []Remote{cached(far, 8000), cached(near, 8000)}, want: Decision{DC: "dc2", Reason: ReasonPrefix}},
		{name: "prefix: local wait counts in remote's favour", s: on,
			local:   Local{Healthy: true, PromptTokens: 8000, PrefillRate: 10000, QueueWait: time.Second},
			remotes: []Remote{{DC: "dc2", RTT: 20 * ms, QueueWait: 1500 * ms, CachedTokens: 8000, Usable: true}},
			want:    Decision{DC: "dc2", Reason: ReasonPrefix}},
		{name: "prefix, local holds as much: local", s: on,
			local: Local{Healthy: true, PromptTokens: 8000, CachedTokens: 8000, PrefillRate: 10000}, remotes: []Remote{cached(near, 8000)}},
		{name: "prefix, spill paused: local", s: on, paused: true, local: healthy, remotes: []Remote{cached(near, 8000)}},
		{name: "prefix, unusable remote: local", s: on, local: healthy, remotes: []Remote{unusable(cached(near, 8000))}},
		{name: "prefix, unknown rate: local", s: on, local: Local{Healthy: true, PromptTokens: 8000},
			remotes: []Remote{cached(near, 8000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, Decide(tc.s, tc.forwarded, tc.paused, tc.local, tc.remotes))
		})
	}
}

func TestBreaker(t *testing.T) {
	var b breaker
	t0 := time.Unix(1000, 0)
	cool := 10 * time.Second
	must.True(t, b.allow(t0, cool))
	must.Eq(t, Closed, b.report(false, t0, 3))
	must.Eq(t, Closed, b.report(false, t0, 3))
	must.Eq(t, Closed, b.report(true, t0, 3)) // a success resets the count
	for range 2 {
		b.report(false, t0, 3)
	}
	must.Eq(t, Open, b.report(false, t0, 3))
	must.False(t, b.allow(t0.Add(time.Second), cool))
	must.False(t, b.usable(t0.Add(time.Second), cool))
	// After the cooldown exactly one probe goes.
	must.True(t, b.usable(t0.Add(cool), cool))
	must.True(t, b.allow(t0.Add(cool), cool))
	must.False(t, b.allow(t0.Add(cool), cool))
	// A failed probe reopens at once.
	must.Eq(t, Open, b.report(false, t0.Add(cool), 3))
	must.False(t, b.allow(t0.Add(cool+time.Second), cool))
	must.True(t, b.allow(t0.Add(2*cool), cool))
	must.Eq(t, Closed, b.report(true, t0.Add(2*cool), 3))
	must.True(t, b.allow(t0.Add(2*cool), cool))
}

func TestSpillBudgetHysteresis(t *testing.T) {
	var b SpillBudget
	t0 := time.Unix(2000, 0)
	// 10 requests, 2 spilled: 20 % reaches max 0.2 → paused.
	for i := range 10 {
		b.Record(t0, i < 2)
	}
	must.True(t, b.Paused(t0, 0.2, 0.1))
	// 15 % is under max but over resume: still paused (no flapping).
	for range 3 {
		b.Record(t0, false)
	}
	must.True(t, b.Paused(t0, 0.2, 0.1))
	// 2/20 = 10 % reaches resume: spilling resumes.
	for range 7 {
		b.Record(t0, false)
	}
	must.False(t, b.Paused(t0, 0.2, 0.1))
	// 3/21 ≈ 14 %: under max, not paused again.
	b.Record(t0, true)
	must.False(t, b.Paused(t0, 0.2, 0.1))
	// The window forgets: eleven seconds later nothing counts.
	must.Eq(t, 0.0, func() float64 { b.Paused(t0.Add(11*time.Second), 0.2, 0.1); return b.share() }())
	// max 0 never lets anything spill.
	var z SpillBudget
	must.True(t, z.Paused(t0, 0, 0))
}
