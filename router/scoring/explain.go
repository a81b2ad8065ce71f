package scoring

import (
	"context"
	"slices"
)

// TermValue is one weighted term's value for one worker.
type TermValue struct {
	Name   string
	Weight float64
	Value  float64 // in [0, 1], before the weight
}

// Explain scores workers term by term under cfg, as Pick's weighted policy
// does, and returns the value each weighted term gave chosen (sorted by
// term name). It runs every term again: call it only where the answer is
// kept (a sampled trace), never on every request. It returns nil for the
// other policies, which have no terms, and when chosen is not in workers.
func (s *Selector) Explain(ctx context.Context, cfg Config, req *Request, workers []*Worker, chosen *Worker) []TermValue {
	at := slices.Index(workers, chosen)
	if cfg.Policy != Weighted || at < 0 {
		return nil
	}
	buf := make([]float64, len(workers))
	out := make([]TermValue, 0, len(cfg.Weights))
	for name, wt := range cfg.Weights {
		t, ok := s.reg.terms[name]
		if !ok || wt == 0 {
			continue
		}
		for i := range buf {
			buf[i] = Neutral
		}
		t.Score(ctx, req, workers, buf)
		out = append(out, TermValue{Name: name, Weight: wt, Value: clamp01(buf[at])})
	}
	slices.SortFunc(out, func(a, b TermValue) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// PrefixMatch is what the prefix match found on one worker for a request.
type PrefixMatch struct {
	Blocks    int // request blocks at the worker's block size
	Matched   int // the longest prefix of them the worker holds, any tier
	GPUBlocks int // of Matched, those in GPU memory
}

// Tier names where a match lies: "gpu" (every matched block in GPU memory),
// "offloaded" (none: host memory, disk or a peer), "mixed", or "none".
func (m PrefixMatch) Tier() string {
	switch {
	case m.Matched == 0:
		return "none"
	case m.GPUBlocks >= m.Matched:
		return "gpu"
	case m.GPUBlocks == 0:
		return "offloaded"
	}
	return "mixed"
}

// PrefixMatchOn returns the prefix match on worker; ok is false when no
// term matched the request (see PrefixResult).
func (r *Request) PrefixMatchOn(worker string) (PrefixMatch, bool) {
	if r.prefixHits == nil {
		return PrefixMatch{}, false
	}
	h := r.prefixHits[worker]
	return PrefixMatch{Blocks: h.keys, Matched: h.blocks, GPUBlocks: int(h.gpu)}, true
}
