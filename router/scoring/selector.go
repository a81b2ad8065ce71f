package scoring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Policy names.
const (
	RoundRobin = "round_robin"
	LeastLoad  = "least_load"
	Weighted   = "weighted"
)

// Config is the routing policy for one model.
type Config struct {
	Policy  string             `json:"policy"`
	Weights map[string]float64 `json:"weights,omitempty"` // term name → weight, for weighted
}

// ErrNoWorker is returned when there is no candidate to pick.
var ErrNoWorker = errors.New("no healthy worker")

// Validate reports the first problem in c against the registry's terms.
func (r *Registry) Validate(c Config) error {
	switch c.Policy {
	case RoundRobin, LeastLoad:
	case Weighted:
		positive := false
		for name, w := range c.Weights {
			if _, ok := r.terms[name]; !ok {
				return fmt.Errorf("weights: unknown term %q (known: %v)", name, r.Names())
			}
			if math.IsNaN(w) || math.IsInf(w, 0) || w < 0 {
				return fmt.Errorf("weights.%s: must be a finite number ≥ 0, got %v", name, w)
			}
			positive = positive || w > 0
		}
		if !positive {
			return errors.New("weights: weighted policy needs at least one weight > 0")
		}
	case "":
		return errors.New("policy: missing (round_robin, least_load or weighted)")
	default:
		return fmt.Errorf("policy: unknown %q (round_robin, least_load or weighted)", c.Policy)
	}
	return nil
}

// Selector picks workers. It keeps the round-robin position per model.
type Selector struct {
	reg  *Registry
	rr   sync.Map // model → *atomic.Uint64
	intn func(n int) int
}

// SelectorConfig configures a Selector.
type SelectorConfig struct {
	// Registry holds the terms a weighted policy scores with (required).
	Registry *Registry
	// TieBreak breaks exact score ties with a draw in [0, n) (default: the
	// process-wide random source). A seeded source makes a simulation repeat
	// exactly; it must be safe for the selector's concurrent use (a
	// *rand.Rand is not: give one to a single-goroutine caller only).
	TieBreak func(n int) int
}

// NewSelector returns a selector over cfg.Registry's terms.
func NewSelector(cfg SelectorConfig) *Selector {
	s := &Selector{reg: cfg.Registry, intn: cfg.TieBreak}
	if s.intn == nil {
		s.intn = rand.IntN
	}
	return s
}

// Decision is a pick with the scores that led to it (weighted only).
type Decision struct {
	Worker *Worker
	Scores []float64 // per candidate, same order as the input; nil unless weighted
}

// Pick chooses one of workers for req under cfg. cfg must have passed
// Registry.Validate.
func (s *Selector) Pick(ctx context.Context, cfg Config, req *Request, workers []*Worker) (Decision, error) {
	if len(workers) == 0 {
		return Decision{}, ErrNoWorker
	}
	switch cfg.Policy {
	case RoundRobin:
		v, ok := s.rr.Load(req.Model)
		if !ok { // LoadOrStore alone would allocate a counter every time
			v, _ = s.rr.LoadOrStore(req.Model, new(atomic.Uint64))
		}
		n := v.(*atomic.Uint64).Add(1) - 1
		return Decision{Worker: workers[n%uint64(len(workers))]}, nil
	case LeastLoad:
		loads := make([]float64, len(workers))
		for i, w := range workers {
			loads[i] = -w.Signals().Load() // best = highest
		}
		return Decision{Worker: workers[s.argmax(loads)]}, nil
	case Weighted:
		total := make([]float64, len(workers))
		buf := make([]float64, len(workers))
		for name, wt := range cfg.Weights {
			if wt == 0 {
				continue
			}
			t, ok := s.reg.terms[name]
			if !ok {
				return Decision{}, fmt.Errorf("scoring term %q not registered", name)
			}
			for i := range buf {
				buf[i] = Neutral
			}
			t.Score(ctx, req, workers, buf)
			for i, v := range buf {
				total[i] += wt * clamp01(v)
			}
		}
		return Decision{Worker: workers[s.argmax(total)], Scores: total}, nil
	default:
		return Decision{}, fmt.Errorf("unknown policy %q", cfg.Policy)
	}
}

// argmax returns the index of the highest value, choosing uniformly at random
// among ties so equal workers share load.
func (s *Selector) argmax(v []float64) int {
	const eps = 1e-9
	best, ties := 0, 1
	for i := 1; i < len(v); i++ {
		switch {
		case v[i] > v[best]+eps:
			best, ties = i, 1
		case v[i] >= v[best]-eps:
			ties++
			if s.intn(ties) == 0 {
				best = i
			}
		}
	}
	return best
}
