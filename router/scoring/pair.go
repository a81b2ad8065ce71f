package scoring

import (
	"context"
	"slices"
)

// Pair is a prefill worker and a decode worker chosen together for one
// disaggregated request.
type Pair struct {
	Prefill, Decode *Worker
}

// The two sides of a pair weigh different terms (ARCHITECTURE.md's cost
// model): the prefill worker computes the uncached prompt, so its time to
// the first token (queued prefill tokens over its learned rate, less what
// its cache holds) and its prefix overlap decide; the decode worker holds
// the sequence for its whole generation, so its load and free KV cache
// decide.
var (
	prefillSide = map[string]float64{"ttft": 2, "prefix": 1}
	decodeSide  = map[string]float64{"load": 1, "kv_capacity": 1}
)

// PickPair chooses a prefill and a decode worker for req: the pair that
// shares a prefill/decode protocol (Worker.PDProtocol) and has the highest
// sum of the prefill worker's score and the decode worker's, each side a
// weighted mean in [0, 1] of its terms (terms the registry lacks are left
// out; a side with none left scores by load). Ties are broken at random.
// The prefix match runs once over both sides, so that afterwards
// req.UncachedTokens knows every candidate of either side.
func (s *Selector) PickPair(ctx context.Context, req *Request, prefill, decode []*Worker) (Pair, error) {
	if len(prefill) == 0 || len(decode) == 0 {
		return Pair{}, ErrNoWorker
	}
	if t, ok := s.reg.terms["prefix"].(*PrefixTerm); ok {
		all := make([]*Worker, 0, len(prefill)+len(decode))
		t.match(ctx, req, append(append(all, prefill...), decode...))
	}
	ps := s.side(ctx, prefillSide, req, prefill)
	ds := s.side(ctx, decodeSide, req, decode)
	const eps = 1e-9
	var best Pair
	bestScore, ties := -1.0, 0
	for i, p := range prefill {
		for j, d := range decode {
			if p.PDProtocol != d.PDProtocol {
				continue
			}
			v := ps[i] + ds[j]
			switch {
			case v > bestScore+eps:
				best, bestScore, ties = Pair{p, d}, v, 1
			case v >= bestScore-eps:
				ties++
				if s.intn(ties) == 0 {
					best = Pair{p, d}
				}
			}
		}
	}
	if best.Prefill == nil {
		return Pair{}, ErrNoWorker
	}
	return best, nil
}

// side scores workers by the weighted mean of the registered terms among
// weights, or by load when none is registered.
func (s *Selector) side(ctx context.Context, weights map[string]float64, req *Request, workers []*Worker) []float64 {
	total := make([]float64, len(workers))
	buf := make([]float64, len(workers))
	sum := 0.0
	names := make([]string, 0, len(weights))
	for name := range weights {
		names = append(names, name)
	}
	slices.Sort(names) // a fixed order: terms share the prefix match
	for _, name := range names {
		t, ok := s.reg.terms[name]
		if !ok {
			continue
		}
		for i := range buf {
			buf[i] = Neutral
		}
		t.Score(ctx, req, workers, buf)
		for i, v := range buf {
			total[i] += weights[name] * clamp01(v)
		}
		sum += weights[name]
	}
	if sum == 0 {
		LoadTerm{}.Score(ctx, req, workers, total)
		return total
	}
	for i := range total {
		total[i] /= sum
	}
	return total
}
