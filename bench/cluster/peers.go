package cluster

import (
	"fmt"
	"strconv"

	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Peer policies: other projects' published routing algorithms with their
// shipped defaults, restated in Go for the simulator (none of their code is
// linked). Each is fed what the peer itself uses: KV events through the same
// event-fed index the Oasis policy reads (an exact view of which worker holds
// which block, as llm-d's kvblock index and Dynamo's KvIndexer are when
// events arrive), or its own approximate tree learned from its own routing
// decisions. The files peer_*.go cite the version each was read from.
const (
	PolicyLLMD      = "llmd"      // llm-d inference scheduler, default precise-prefix profile
	PolicyDynamo    = "dynamo"    // NVIDIA Dynamo KV router
	PolicySGLang    = "sglang"    // SGLang router cache_aware
	PolicyAIBrix    = "aibrix"    // AIBrix gateway prefix-cache
	PolicyProdStack = "prodstack" // vLLM production-stack prefixaware
)

// PeerPolicies lists the peer policies in report order.
var PeerPolicies = []string{PolicyLLMD, PolicyDynamo, PolicySGLang, PolicyAIBrix, PolicyProdStack}

// IsPeer reports whether p is a peer policy.
func IsPeer(p string) bool {
	for _, q := range PeerPolicies {
		if p == q {
			return true
		}
	}
	return false
}

// peer is one peer routing algorithm. pick returns the chosen worker's index;
// routed tells it where the request went (approximate trees learn from it).
type peer interface {
	pick(v *peerView) int
	routed(v *peerView, w int)
	// events reports whether it reads the event-fed index (the engines must
	// emit KV events).
	events() bool
}

// peerView is what a peer sees at one decision.
type peerView struct {
	s     *sim
	keys  []uint64 // the prompt's chained block digests (engine block size)
	input int      // prompt tokens
	now   int64    // ns
	// uncached is the prompt tokens the peer expects the chosen worker to
	// compute (Dynamo's prefill load); the whole prompt unless it says.
	uncached int
}

// workers is the number of candidates.
func (v *peerView) workers() int { return len(v.s.workers) }

// inFlight is the router's count of requests sent to worker i and not done
// (what SGLang's and AIBrix's routers track as a worker's load).
func (v *peerView) inFlight(i int) int { return v.s.workers[i].pl.inFlight }

// eventMatch returns, per worker, the longest prefix (in engine blocks) the
// event-fed index says it holds.
func (v *peerView) eventMatch() []int {
	s := v.s
	out := make([]int, len(s.workers))
	s.matchBuf = s.src.events.Match(v.keys, prefixindex.DefaultTierWeights(), s.matchBuf[:0])
	for _, m := range s.matchBuf {
		if i, err := strconv.Atoi(m.Worker[1:]); err == nil && i < len(out) {
			out[i] = m.Blocks
		}
	}
	return out
}

// peerLoad is what the simulated router tracks per worker for the peers:
// requests in flight, the prompt tokens it predicted each must compute and
// that have no first token yet (Dynamo's prefill load), and the tokens of
// in-flight requests, prompt plus output so far (Dynamo's active blocks).
type peerLoad struct {
	inFlight int
	prefill  int64
	active   int64
}

// newPeer builds the peer policy named by cfg.Policy for n workers.
func newPeer(cfg Config, n int) (peer, error) {
	ev := cfg.Learning != LearnApprox
	switch cfg.Policy {
	case PolicyLLMD:
		return newLLMD(n, ev), nil
	case PolicyDynamo:
		return newDynamo(n, ev, cfg.DynamoTemperature, cfg.BlockSize), nil
	case PolicySGLang:
		return newSGLang(n), nil
	case PolicyAIBrix:
		return newAIBrix(n), nil
	case PolicyProdStack:
		return newProdStack(n), nil
	}
	return nil, fmt.Errorf("unknown peer policy %q", cfg.Policy)
}

// argmax returns the index of the highest score; ties go to a uniformly
// random one of them (llm-d's max-score picker and production-stack shuffle
// ties) when rnd is set, else to the lowest index.
func argmax(scores []float64, rnd func(int) int) int {
	best := 0
	ties := 1
	for i := 1; i < len(scores); i++ {
		switch {
		case scores[i] > scores[best]:
			best, ties = i, 1
		case scores[i] == scores[best]:
			ties++
			if rnd != nil && rnd(ties) == 0 {
				best = i // reservoir sampling over the ties
			}
		}
	}
	return best
}

// leastInFlight is the worker with the fewest requests in flight, lowest
// index first.
func leastInFlight(v *peerView) int {
	best := 0
	for i := 1; i < v.workers(); i++ {
		if v.inFlight(i) < v.inFlight(best) {
			best = i
		}
	}
	return best
}

// pickPeer asks the peer policy for request idx's worker.
func (s *sim) pickPeer(idx int) (*worker, *scoring.Request, error) {
	r := s.reqs[idx]
	s.view = peerView{s: s, keys: r.keys, input: r.Input, now: s.now, uncached: r.Input}
	w := s.peer.pick(&s.view)
	if w < 0 || w >= len(s.workers) {
		return nil, nil, fmt.Errorf("%s picked worker %d of %d", s.cfg.Policy, w, len(s.workers))
	}
	return s.workers[w], nil, nil
}

// routedPeer does the router-side bookkeeping of a request sent to w: the
// peers' load signals and, for a peer policy, its own learning.
func (s *sim) routedPeer(w *worker, f *flight, now int64) {
	w.pl.inFlight++
	w.pl.active += int64(f.prompt)
	if s.peer == nil {
		w.pl.prefill += f.peerPrefill
		return
	}
	f.peerPrefill = int64(s.view.uncached)
	w.pl.prefill += f.peerPrefill
	s.view.now = now
	s.peer.routed(&s.view, int(w.idx))
}

// finishPeer undoes routedPeer when f completes and records its TPOT.
func (s *sim) finishPeer(w *worker, f *flight, now int64) {
	w.pl.inFlight--
	w.pl.active -= int64(f.prompt + f.output)
	if f.output > 1 && f.firstAt > 0 {
		s.tpots = append(s.tpots, float64(now-f.firstAt)/1e9/float64(f.output-1))
	}
}
