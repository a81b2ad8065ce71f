package cluster

import (
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/router/peers"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
)

// router is one of a datacenter's routers (Config.Routers > 1): its own
// view of every worker (router-side in-flight and pending prefill, the
// peers' part as of the last exchange), its own approximate prefix
// records and its own Selector. The KV-event index is one for all: every
// router subscribes to every engine's events, so with equal delivery delay
// their event-fed views are the same.
type router struct {
	ws  []*scoring.Worker // by worker index
	src *source
	sel *scoring.Selector
	out peers.Outbox // prefix records for the next exchange
}

// newRouters builds the routers of Config.Routers > 1; the first is the
// simulation's own fields (ws, src, sel), so one router is the plain sim.
func (s *sim) newRouters() error {
	n := s.cfg.Routers
	if n <= 1 {
		return nil
	}
	if s.peer != nil || s.fleet != nil {
		return fmt.Errorf("routers: %d routers run Oasis's own policies without autoscaling", n)
	}
	if s.cfg.ShareSignals && (s.cfg.ShareLoads || s.cfg.SharePrefixes) {
		return fmt.Errorf("routers: ShareSignals is exclusive with ShareLoads and SharePrefixes")
	}
	s.routers = []*router{{ws: s.ws, src: s.src, sel: s.sel}}
	for i := 1; i < n; i++ {
		// The oracle shares the first router's prefix source too (its
		// approximate record and its record of decisions in flight): as
		// if the routers were one.
		r := &router{src: s.src}
		if !s.cfg.ShareSignals {
			r.src = &source{events: s.src.events, approx: prefixindex.New(prefixindex.Config{TTL: int64(s.cfg.ApproxTTL)}),
				inflight: newInflight(s.cfg)}
		}
		for _, w := range s.workers {
			sw := *w.sw
			r.ws = append(r.ws, &sw)
			if s.cfg.ShareSignals {
				continue
			}
			sw.Live = scoring.NewLive()
			if r.src.inflight != nil {
				_ = r.src.inflight.AddWorker(w.id, 0)
			}
			if s.cfg.Learning != LearnEvents {
				g := w.gpu
				if err := r.src.approx.AddTieredWorker(w.id, prefixindex.Capacity{GPU: g.Blocks, CPU: g.CPUBlocks, Disk: g.DiskBlocks}); err != nil {
					return fmt.Errorf("router %d, worker %s: %w", i, w.id, err)
				}
			}
		}
		var err error
		if r.sel, err = s.newSelector(r.src, s.cfg.Seed+uint64(i)); err != nil {
			return err
		}
		s.routers = append(s.routers, r)
	}
	if s.cfg.ShareLoads || s.cfg.SharePrefixes {
		s.push(event{t: int64(s.peerInterval()), kind: evPeers})
	}
	return nil
}

func (s *sim) peerInterval() time.Duration {
	if s.cfg.PeerInterval > 0 {
		return s.cfg.PeerInterval
	}
	return peers.DefaultInterval
}

// routerOf is the router request idx arrives at: a uniform draw fixed by
// the run's seed (a load balancer in front of the nodes, without
// stickiness).
func (s *sim) routerOf(idx int) int {
	x := uint64(idx)*0x9e3779b97f4a7c15 ^ s.cfg.Seed
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return int(x % uint64(len(s.routers)))
}

// useRouter makes request idx's router the one deciding.
func (s *sim) useRouter(idx int) {
	if s.routers == nil {
		return
	}
	s.cur = s.routerOf(idx)
	r := s.routers[s.cur]
	s.ws, s.src, s.sel = r.ws, r.src, r.sel
}

// scoringWorker is the deciding router's view of w.
func (s *sim) scoringWorker(w *worker) *scoring.Worker {
	if s.routers == nil {
		return w.sw
	}
	return s.routers[s.cur].ws[w.idx]
}

// scoringWorkers are every router's view of w (engine and power signals:
// each router scrapes every engine).
func (s *sim) scoringWorkers(w *worker) []*scoring.Worker {
	if s.routers == nil {
		return []*scoring.Worker{w.sw}
	}
	out := make([]*scoring.Worker, len(s.routers))
	for i, r := range s.routers {
		out[i] = r.ws[w.idx]
	}
	return out
}

// recorded queues the deciding router's approximate record of keys on w
// for its peers.
func (s *sim) recorded(w *worker, keys []uint64) {
	if s.routers != nil && s.cfg.SharePrefixes {
		s.routers[s.cur].out.Add(w.id, keys)
	}
}

// exchange is one round of router/peers' messages: each router's
// requests and pending prefill per worker become the others' SetPeers
// (what peers.EngineLoads sums), and each router's prefix records since the
// last round are stored in the others' approximate indexes.
func (s *sim) exchange(now int64) {
	if s.cfg.ShareLoads {
		own := make([][]peers.EngineLoad, len(s.routers))
		total := make([]peers.EngineLoad, len(s.workers))
		for ri, r := range s.routers {
			own[ri] = make([]peers.EngineLoad, len(s.workers))
			for i, sw := range r.ws {
				sig := sw.Live.Snapshot()
				own[ri][i] = peers.EngineLoad{InFlight: sig.InFlight, PendingPrefill: sig.PendingPrefillTokens}
				total[i].InFlight += sig.InFlight
				total[i].PendingPrefill += sig.PendingPrefillTokens
			}
		}
		for ri, r := range s.routers {
			for i, sw := range r.ws {
				sw.Live.SetPeers(total[i].InFlight-own[ri][i].InFlight, total[i].PendingPrefill-own[ri][i].PendingPrefill)
			}
		}
	}
	if !s.cfg.SharePrefixes {
		return
	}
	sent := make([][]peers.Prefix, len(s.routers))
	for i, r := range s.routers {
		var dropped int
		sent[i], dropped = r.out.Take()
		s.prefixDrops += dropped
	}
	for i, r := range s.routers {
		for j, recs := range sent {
			if j == i {
				continue
			}
			for _, p := range recs {
				_ = r.src.approx.Store(p.Engine, prefixindex.TierGPU, p.Keys, now)
			}
		}
	}
}

// routersResult fills the routers' part of r.
func (s *sim) routersResult(r *Result) {
	if s.routers == nil {
		return
	}
	r.Routers, r.ShareLoads, r.SharePrefixes, r.PrefixDrops = len(s.routers), s.cfg.ShareLoads, s.cfg.SharePrefixes, s.prefixDrops
	r.ShareSignals = s.cfg.ShareSignals
}

// MaxTieSpread bounds how far SpreadTies moves an arrival: the trace's
// timestamps are whole seconds for most requests.
const MaxTieSpread = 1000 // ms

// SpreadTies returns reqs (sorted by arrival) with each run of requests
// that share one timestamp spread evenly over the time to the next
// timestamp (at most MaxTieSpread), in order: the Mooncake traces stamp
// most requests to the second, so several arrive at the same instant, which
// one router takes one after the other knowing each, but N routers take
// at once, each blind to the others' choice however often they exchange
// loads. Real arrivals within a second are not simultaneous. The requests
// are copies (their keys included); reqs is not changed.
func SpreadTies(reqs []*Request) []*Request {
	out := make([]*Request, len(reqs))
	for i := 0; i < len(reqs); {
		j := i + 1
		for j < len(reqs) && reqs[j].Arrival == reqs[i].Arrival {
			j++
		}
		gap := int64(MaxTieSpread)
		if j < len(reqs) {
			gap = min(gap, max(reqs[j].Arrival-reqs[i].Arrival, 0))
		}
		for k := i; k < j; k++ {
			r := *reqs[k]
			r.Arrival += int64(k-i) * gap / int64(j-i)
			out[k] = &r
		}
		i = j
	}
	return out
}
