package cluster

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// RoutingSLO is the objective a rate is sustained at: TTFT p90 and TPOT p90, s.
type RoutingSLO struct {
	TTFTP90 float64 `json:"ttft_p90_s"`
	TPOTP90 float64 `json:"tpot_p90_s"`
}

// DefaultRoutingSLO is TTFT p90 ≤ 2 s (the routing benchmark's SLO for the trace's
// ~12k-token prompts) and TPOT p90 ≤ 100 ms (DistServe's chatbot SLO, as in
// bench-disagg).
func DefaultRoutingSLO() RoutingSLO { return RoutingSLO{TTFTP90: 2, TPOTP90: 0.1} }

// Met reports whether r meets both percentiles with every request completed.
func (o RoutingSLO) Met(r Result) bool {
	return r.Completed > 0 && r.Completed+r.Rejected == r.Requests && r.TTFTP90 <= o.TTFTP90 && r.TPOTP90 <= o.TPOTP90
}

// ArrivalSeconds is how long the run's requests took to arrive: the trace's
// span at the run's rate scale.
func (r Result) ArrivalSeconds() float64 {
	if r.Rate == 0 {
		return 0
	}
	return float64(r.Requests) / r.Rate
}

// DrainSeconds is how long the run went on after its last arrival.
func (r Result) DrainSeconds() float64 { return max(0, r.Makespan-r.LastArrival) }

// BurstBound reports whether the run spent longer draining after its last
// arrival than its requests took to arrive: its rate then measures how fast
// the cluster absorbs one burst of the trace, not a rate it sustains, and a
// longer trace (a generator's n knob) is needed to tell policies apart.
func (r Result) BurstBound() bool { return r.Rate > 0 && r.DrainSeconds() > r.ArrivalSeconds() }

// Bisection is one policy's highest SLO-meeting rate, found by bisection.
type Bisection struct {
	Policy   string  `json:"policy"`
	Learning string  `json:"learning,omitempty"`
	Scale    float64 `json:"rate_scale"` // 0: no rate met the SLO
	Best     Result  `json:"best"`       // the run at Scale
	// FailScale is the lowest rate scale tried above Scale that failed.
	FailScale float64  `json:"fail_scale"`
	Runs      []Result `json:"runs"` // the runs bisection added
}

// Bisect finds the highest rate scale at which run meets slo. swept are runs
// already made (any scales); above the highest meeting one it doubles the
// scale while the SLO holds (up to maxScale), then halves the interval
// between the highest meeting and the lowest failing scale steps times.
func Bisect(swept []Result, slo RoutingSLO, steps int, maxScale float64, run func(float64) (Result, error)) (Bisection, error) {
	var b Bisection
	lo, hi := 0.0, 0.0
	var best Result
	consider := func(r Result) {
		if slo.Met(r) {
			if r.RateScale > lo {
				lo, best = r.RateScale, r
			}
		} else if hi == 0 || r.RateScale < hi {
			hi = r.RateScale
		}
	}
	runAt := func(x float64) error {
		r, err := run(x)
		if err != nil {
			return err
		}
		b.Runs = append(b.Runs, r)
		consider(r)
		return nil
	}
	for _, r := range swept {
		consider(r)
	}
	if hi != 0 && hi < lo { // not monotone: bisect above the highest meeting rate
		hi = 0
		for _, r := range swept {
			if !slo.Met(r) && r.RateScale > lo && (hi == 0 || r.RateScale < hi) {
				hi = r.RateScale
			}
		}
	}
	for hi == 0 && lo > 0 && lo*2 <= maxScale {
		if err := runAt(lo * 2); err != nil {
			return b, err
		}
	}
	for i := 0; i < steps && hi > 0; i++ {
		if err := runAt((lo + hi) / 2); err != nil {
			return b, err
		}
	}
	b.Scale, b.Best, b.FailScale = lo, best, hi
	return b, nil
}

// BestPeer is the peer bisection with the highest request rate meeting the
// SLO. Throughput at SLO is that offered rate: completed requests over the
// makespan would also count the drain of a finite trace's last requests.
func BestPeer(bs []Bisection) (Bisection, bool) {
	var best Bisection
	ok := false
	for _, b := range bs {
		if IsPeer(b.Policy) && (!ok || b.Best.Rate > best.Best.Rate) {
			best, ok = b, true
		}
	}
	return best, ok
}

// WriteBisections prints each policy's highest SLO-meeting rate, and its
// share of the cluster's ceiling (c; none when c.Rate is zero).
func WriteBisections(w io.Writer, slo RoutingSLO, c Ceiling, bs []Bisection) {
	fmt.Fprintf(w, "\nthroughput at SLO (TTFT p90 <= %.1f s and TPOT p90 <= %.0f ms), by bisection:\n", slo.TTFTP90, slo.TPOTP90*1000)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tlearning\tscale\tfailed at\trate r/s\t÷ceiling\tdone r/s\thit\tTTFT p90\tTPOT p90 ms\tarrivals s\tdrain s\truns\t\n")
	sorted := slices.Clone(bs)
	slices.SortStableFunc(sorted, func(a, b Bisection) int {
		switch {
		case a.Best.Rate > b.Best.Rate:
			return -1
		case a.Best.Rate < b.Best.Rate:
			return 1
		}
		return 0
	})
	burst := false
	for _, b := range sorted {
		mark := ""
		if b.Best.BurstBound() {
			mark, burst = " *", true
		}
		share := "-"
		if c.Rate > 0 && b.Scale > 0 {
			share = fmt.Sprintf("%.2f", b.Best.Rate/c.Rate)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.3f\t%.2f%s\t%s\t%.2f\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\t%d\t\n", b.Policy, b.Learning, b.Scale, b.FailScale,
			b.Best.Rate, mark, share, b.Best.Throughput, b.Best.HitRatio, b.Best.TTFTP90, b.Best.TPOTP90*1000, b.Best.ArrivalSeconds(), b.Best.DrainSeconds(), len(b.Runs))
	}
	tw.Flush()
	if c.Rate > 0 {
		fmt.Fprintf(w, "ceiling: %.2f r/s (scale %.3f) with every GPU's steps at most %.0f ms, %.2f r/s (scale %.3f) without step overhead: the oracle's hits, %.0f prompt and %.0f decode tokens a request, each GPU on the work it does best (cluster.Ceiling; TTFT, the batches' KV and the spread of hits over workers not counted)\n",
			c.Rate, c.Scale, slo.TPOTP90*1000, c.WorkRate, c.WorkScale, c.PrefillTokens, c.DecodeTokens)
	}
	if burst {
		fmt.Fprintln(w, "* burst-bound: the run drained longer after its last arrival than its requests took to arrive; the rate is how fast the cluster absorbs one burst, not a sustained rate (a longer trace tells policies apart: a generator's n knob)")
	}
}

// PeerTargets evaluates the targets for Oasis against the best peer
// in the same run: throughput at SLO, TTFT p90 at that peer's highest
// SLO-meeting rate (atPeer: oasis run there), hit ratio against the oracle
// with events, and approximate learning's hit ratio against the peers'
// approximate modes (variants: runs at the reference rate; a peer counts
// only where it meets slo there, so a policy that piles every request on
// one worker does not win on hit ratio).
func PeerTargets(bs []Bisection, atPeer Result, sums []Summary, variants []Result, slo RoutingSLO) []Target {
	peer, ok := BestPeer(bs)
	var oa Bisection
	for _, b := range bs {
		if b.Policy == PolicyOasis {
			oa = b
		}
	}
	if !ok || oa.Policy == "" {
		return nil
	}
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	var t []Target
	add := func(name, goal string, v float64, met bool) {
		t = append(t, Target{Name: name, Goal: goal, Measured: v, Met: met})
	}
	if peer.Scale == 0 { // no peer meets the SLO at any rate tried: no ratio
		add("throughput at SLO oasis (r/s; no peer meets the SLO at any rate tried)", "> 0", oa.Best.Rate, oa.Scale > 0)
	} else {
		thr := ratio(oa.Best.Rate, peer.Best.Rate)
		name := "throughput at SLO oasis / best peer (" + peer.Policy + ")"
		if oa.Best.BurstBound() || peer.Best.BurstBound() {
			name += " burst-bound"
		}
		// Both rates are the trace's requests over its span at a scale, so
		// their ratio is the scales' up to rounding (40× over 32× is
		// 1.2499999999999998): compared with a relative slack of 1e-9.
		add(name, ">= 1.25", thr, thr >= 1.25*(1-1e-9))
		ttft := ratio(atPeer.TTFTP90, peer.Best.TTFTP90)
		add("TTFT p90 oasis / "+peer.Policy+" at its highest SLO rate", "<= 0.8", ttft, ttft > 0 && ttft <= 0.8)
	}
	for _, s := range sums {
		if s.Policy == PolicyOasis {
			h := ratio(s.HitRatio, s.OracleHitRatio)
			add("hit ratio / oracle, oasis with events", ">= 0.95", h, h >= 0.95)
		}
	}
	oaHit, peerHit, name := approxHits(variants, slo, true)
	if name == "" {
		oaHit, peerHit, name = approxHits(variants, slo, false)
		name += "; none meets the SLO"
	}
	a := ratio(oaHit, peerHit)
	add("approx hit ratio oasis / best peer approx meeting SLO ("+name+")", ">= 1.0", a, a >= 1)
	return t
}

// approxHits returns Oasis's approximate-learning hit ratio and the best
// peer approximate mode's (only those meeting slo when meeting).
func approxHits(variants []Result, slo RoutingSLO, meeting bool) (oasis, peer float64, name string) {
	for _, r := range variants {
		switch {
		case r.Learning != LearnApprox:
		case r.Policy == PolicyOasis:
			oasis = r.HitRatio
		case IsPeer(r.Policy) && (!meeting || slo.Met(r)) && r.HitRatio > peer:
			peer, name = r.HitRatio, r.Policy
		}
	}
	return oasis, peer, name
}
