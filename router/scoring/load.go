package scoring

import "context"

// LoadTerm ("load") prefers the least occupied worker. With L the worker's
// Signals.Load() (in-flight of this router and its peers, or engine
// running+waiting if larger):
//
//	load_i = (1 + min_j L_j) / (1 + L_i)
//
// The least loaded worker scores 1; the score falls off relative to the
// lightest worker, so one extra request matters at low load and little when
// every worker is deep in its batch.
type LoadTerm struct{}

func (LoadTerm) Name() string { return "load" }

func (LoadTerm) Score(_ context.Context, _ *Request, workers []*Worker, out []float64) {
	if len(workers) == 0 {
		return
	}
	minL := -1.0
	for i, w := range workers {
		out[i] = w.Signals().Load()
		if minL < 0 || out[i] < minL {
			minL = out[i]
		}
	}
	for i := range out[:len(workers)] {
		out[i] = (1 + minL) / (1 + out[i])
	}
}
