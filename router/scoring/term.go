package scoring

import (
	"context"
	"fmt"
	"sort"
)

// Term scores every candidate worker for one request. Score writes one value
// in [0, 1] per worker into out (len(out) == len(workers)); higher is better.
// A term that knows nothing about a worker writes Neutral for it. Score must
// be safe for concurrent use and must not keep req or workers after it returns.
type Term interface {
	Name() string
	Score(ctx context.Context, req *Request, workers []*Worker, out []float64)
}

// Neutral is the score of a worker a term has no information about.
const Neutral = 0.5

// Registry is the set of terms a router can weight, by name. It is built once
// at start-up and read-only afterwards.
type Registry struct {
	terms map[string]Term
}

// NewRegistry returns a registry holding terms. Names must be unique.
func NewRegistry(terms ...Term) (*Registry, error) {
	r := &Registry{terms: make(map[string]Term, len(terms))}
	for _, t := range terms {
		if _, dup := r.terms[t.Name()]; dup {
			return nil, fmt.Errorf("scoring term %q registered twice", t.Name())
		}
		r.terms[t.Name()] = t
	}
	return r, nil
}

// BuiltinTerms returns the terms that need nothing but worker signals.
// The router adds terms with their own state (prefix) next to these.
func BuiltinTerms() []Term {
	return []Term{LoadTerm{}, KVCapacityTerm{}, PowerTerm{}}
}

// RouterRegistry is the registry the router scores with: the built-in terms
// and the cache terms over src. A policy document is valid for the router
// when it is valid against it (src nil: names only, for validation away from
// a router, as the Terraform provider's plan does).
func RouterRegistry(src PrefixSource) (*Registry, error) {
	return NewRegistry(append(BuiltinTerms(), CacheTerms(src)...)...)
}

// CacheTerms returns the terms that read the router's cache state src: prefix,
// and ttft over the prefix term's match (one digest pass and one index match
// per request serve both).
func CacheTerms(src PrefixSource) []Term {
	p := NewPrefixTerm(src)
	return []Term{p, NewTTFTTerm(p)}
}

// Term returns the named term.
func (r *Registry) Term(name string) (Term, bool) {
	t, ok := r.terms[name]
	return t, ok
}

// Names lists the registered term names, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.terms))
	for n := range r.terms {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
