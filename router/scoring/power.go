package scoring

import "context"

// PowerTerm ("power") prefers the worker that turns energy into tokens most
// efficiently. The signals package measures, per worker, generated tokens per
// second G and the GPU power P attributed to the worker (the Nomad node's
// device power split over the engines on that node, or the engine's own power
// gauge) and keeps a smoothed efficiency E = G / P in tokens per joule,
// updated only while the worker is generating (an idle GPU keeps its last
// estimate instead of dropping to zero). The term is
//
//	power_i = E_i / max_j E_j
//
// so the most efficient worker scores 1. Workers without an estimate, or a
// pool where no worker has generated yet, score Neutral.
type PowerTerm struct{}

func (PowerTerm) Name() string { return "power" }

func (PowerTerm) Score(_ context.Context, _ *Request, workers []*Worker, out []float64) {
	maxE := 0.0
	for i, w := range workers {
		s := w.Signals()
		out[i] = -1
		if s.HasPower && s.TokensPerJoule > 0 {
			out[i] = s.TokensPerJoule
			if out[i] > maxE {
				maxE = out[i]
			}
		}
	}
	for i := range out[:len(workers)] {
		if out[i] < 0 || maxE == 0 {
			out[i] = Neutral
			continue
		}
		out[i] = clamp01(out[i] / maxE)
	}
}
