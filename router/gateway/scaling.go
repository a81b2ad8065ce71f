package gateway

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/scoring"
)

// ScalingSignals are the per-model, per-role figures an autoscaler scales
// engines on (metrics.ScalingCollector, observability/README.md "Scaling
// signals"): routable workers, this router's in-flight requests to them, the
// 90th percentile and the median of their estimated TTFT, the median of their learned
// prefill rates, their mean KV usage, and the
// model's estimated admission wait. Hosted workers (oasis_upstream) are left
// out: nothing scales them.
func (g *Gateway) ScalingSignals() []metrics.ScalingSample {
	doc := g.cfg.Policy.Current()
	now := time.Now()
	var out []metrics.ScalingSample
	for _, model := range g.cfg.Pool.Models() {
		byRole := map[string][]*scoring.Worker{}
		for _, w := range routable(g.cfg.Pool.Workers(model), now) {
			if w.Upstream != "" {
				continue
			}
			byRole[roleOf(w)] = append(byRole[roleOf(w)], w)
		}
		_, wait := g.localPressure(model, doc.For(model).Limits)
		for _, role := range slices.Sorted(maps.Keys(byRole)) {
			s := roleSignals(byRole[role])
			s.Model, s.Role, s.QueueWait = model, role, wait.Seconds()
			out = append(out, s)
		}
	}
	return out
}

// roleSignals sums one role's workers' signals.
func roleSignals(ws []*scoring.Worker) metrics.ScalingSample {
	s := metrics.ScalingSample{Workers: len(ws)}
	ttfts := make([]float64, 0, len(ws))
	rates := make([]float64, 0, len(ws))
	var kv float64
	var scraped int
	for _, w := range ws {
		sig := w.Signals()
		s.InFlight += sig.InFlight
		ttfts = append(ttfts, sig.EstimatedTTFT(0).Seconds())
		rates = append(rates, sig.PrefillRate)
		if sig.EngineMetrics {
			kv += sig.KVUsage
			scraped++
		}
	}
	s.TTFTP90, s.TTFTP50 = percentile(ttfts, 0.9), percentile(ttfts, 0.5)
	s.PrefillRate = percentile(rates, 0.5)
	if scraped > 0 {
		s.KVUsage, s.HasKV = kv/float64(scraped), true
	}
	return s
}

// percentile is the nearest-rank q-th percentile of xs (0 for none); it sorts xs.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// roleOf is a worker's engine role as the scaling signals label it.
func roleOf(w *scoring.Worker) string {
	if w.Role == "" {
		return "both"
	}
	return w.Role
}

// beginPrefill is Live.StartPrefill that also counts the tokens for
// arrival-rate autoscaling (oasis_router_scaling_prefill_tokens_total).
func (g *Gateway) beginPrefill(model string, wk *scoring.Worker, n int64) *scoring.Prefill {
	g.m.Scaling.PrefillTokens.WithLabelValues(model, roleOf(wk)).Add(float64(max(n, 0)))
	return wk.Live.StartPrefill(n)
}

// countArrival counts a request for model as an arrival
// (oasis_router_scaling_arrivals_total, what arrival-rate autoscaling sizes
// on): at the top of route and serve, for the client's model and every
// cascade leg's or overflow pool's, engines up or not. Only models the router
// has served count: a model the client names is its text, not a label.
func (g *Gateway) countArrival(model string) {
	if g.cfg.Pool.Known(model) {
		g.m.Scaling.Arrivals.WithLabelValues(model).Inc()
	}
}
