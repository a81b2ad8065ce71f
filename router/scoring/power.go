package scoring

import "context"

// DefaultPowerBatch is the power term's B (see PowerTerm).
const DefaultPowerBatch = 16

// PowerTerm ("power") prefers the worker on which the request's tokens cost
// the fewest joules.
//
// Decoding is memory-bound: every step reads the model's weights once,
// whatever the batch, so a GPU decoding b sequences turns a joule into about
// b times the tokens one decoding a single sequence does, until steps become
// compute-bound. The signals package measures, per worker, generated tokens
// per joule divided by the sequences it was running over the interval: e1,
// the efficiency of one sequence's share of a step on that GPU (the Nomad
// node's device power split over the engines on that node, or the engine's
// own power gauge; smoothed, updated only while the worker generates). A
// request joining a worker with load L shares its steps with L others, so,
// with n = L + 1,
//
//	eff_i   = e1_i · n                    n ≤ B
//	eff_i   = e1_i · B · max(0, 2 − n/B)  n > B
//	power_i = eff_i / max_j eff_j
//
// The most efficient placement scores 1: a fast GPU already decoding beats an
// idle one, and among idle GPUs the more efficient one wins. B (Batch,
// DefaultPowerBatch) is the decode batch consolidation aims for: past it a
// sequence no longer makes the step cheaper per token, but it still makes
// every step of the batch longer, so the preference falls to nothing at 2B
// and work spreads to the next GPU instead of piling onto one. The ttft and
// kv_capacity terms keep consolidation from queueing prefills or filling a
// worker's KV cache. Workers without an estimate, or a pool where no worker
// has generated yet (or every worker is past 2B), score Neutral.
type PowerTerm struct {
	// Batch is B; zero means DefaultPowerBatch.
	Batch float64
}

func (PowerTerm) Name() string { return "power" }

func (t PowerTerm) Score(_ context.Context, _ *Request, workers []*Worker, out []float64) {
	b := t.Batch
	if b <= 0 {
		b = DefaultPowerBatch
	}
	maxE := 0.0
	for i, w := range workers {
		s := w.Signals()
		out[i] = -1
		if s.HasPower && s.SeqTokensPerJoule > 0 {
			n := s.Load() + 1
			if n <= b {
				out[i] = s.SeqTokensPerJoule * n
			} else {
				out[i] = s.SeqTokensPerJoule * b * max(0, 2-n/b)
			}
			maxE = max(maxE, out[i])
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
