package cluster

import (
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/router/peers"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
)

// DefaultPeerDelay is a load message's delivery time between two routers
// of a datacenter: one UDP packet on a LAN, with memberlist's decryption.
const DefaultPeerDelay = time.Millisecond

// router is one of a datacenter's routers (Config.Routers > 1): its own
// view of every worker (router-side in-flight and pending prefill, the
// peers' part as of their last messages), its own approximate prefix
// records and its own Selector. The KV-event index is one for all: every
// router subscribes to every engine's events, so with equal delivery delay
// their event-fed views are the same.
type router struct {
	ws  []*scoring.Worker // by worker index
	src *source
	sel *scoring.Selector
	out peers.Outbox // prefix records for the next message

	// When it sends (as peers.Peers.Run does), and when its pending
	// evPeers fires (-1: none; an event for another time is superseded).
	sched peers.Schedule
	due   int64
	// heard is each sender's last loads by worker index, sum their total
	// (what peers.EngineLoads sums).
	heard [][]peers.EngineLoad
	sum   []peers.EngineLoad
}

// peerMsg is one router's message: its loads by worker index (with
// ShareLoads) and its prefix records since its last message.
type peerMsg struct {
	from     int
	loads    []peers.EngineLoad
	prefixes []peers.Prefix
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
		s.startPeers()
	}
	return nil
}

// startPeers sets each router's schedule and its change hook on its view
// of every worker (what router/app does with worker.Live.OnChange), and
// its first heartbeat, the routers' phases spread over one interval.
func (s *sim) startPeers() {
	iv, minIv := s.cfg.PeerInterval, s.cfg.PeerMinInterval
	if iv <= 0 {
		iv = peers.DefaultInterval
	}
	if minIv <= 0 {
		minIv = min(peers.DefaultMinInterval, iv)
	}
	n := len(s.routers)
	for i, r := range s.routers {
		r.sched = peers.Schedule{Interval: iv, MinInterval: minIv}
		r.heard = make([][]peers.EngineLoad, n)
		r.sum = make([]peers.EngineLoad, len(s.workers))
		for _, sw := range r.ws {
			sw.Live.OnChange(func() { s.loadChanged(i) })
		}
		r.due = int64(iv) * int64(i) / int64(n)
		s.push(event{t: r.due, kind: evPeers, w: int32(i)})
	}
}

// loadChanged is router i's change hook: its next message is due at once,
// or MinInterval after its last one.
func (s *sim) loadChanged(i int) {
	r := s.routers[i]
	r.sched.Changed()
	at := max(int64(r.sched.Next()), s.now)
	if r.due < 0 || at < r.due {
		r.due = at
		s.push(event{t: at, kind: evPeers, w: int32(i)})
	}
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
// for its peers (a change, as peers.Peers.Routed).
func (s *sim) recorded(w *worker, keys []uint64) {
	if s.routers != nil && s.cfg.SharePrefixes {
		s.routers[s.cur].out.Add(w.id, keys)
		s.loadChanged(s.cur)
	}
}

// sendLoad is router i's message at now, if it is still due then: its
// requests and pending prefill per worker and its prefix records, to
// every other router PeerDelay later; then its next heartbeat.
func (s *sim) sendLoad(i int, now int64) {
	r := s.routers[i]
	if now != r.due {
		return // superseded by an earlier send
	}
	m := &peerMsg{from: i}
	wire := peers.Load{Engines: map[string]peers.EngineLoad{}}
	if s.cfg.ShareLoads {
		m.loads = make([]peers.EngineLoad, len(r.ws))
		for k, sw := range r.ws {
			sig := sw.Live.Snapshot()
			m.loads[k] = peers.EngineLoad{InFlight: sig.InFlight, PendingPrefill: sig.PendingPrefillTokens}
			if m.loads[k] != (peers.EngineLoad{}) {
				wire.Engines[wireID(k)] = m.loads[k]
			}
		}
	}
	if s.cfg.SharePrefixes {
		var dropped int
		m.prefixes, dropped = r.out.Take()
		s.prefixDrops += dropped
	}
	// Priced as router/peers encodes it (Nomad-length engine ids).
	recs := make([]peers.Prefix, len(m.prefixes))
	for k, p := range m.prefixes {
		recs[k] = peers.Prefix{Engine: wireID(s.workerIndex(p.Engine)), Keys: p.Keys}
	}
	if b, err := peers.Encode(fmt.Sprintf("oasis-router-10-0-%d-%d-8080", i/256, i%256), uint64(now)+1<<60, wire, recs); err == nil {
		s.peerMessages++
		s.peerBytes += int64(len(b))
	}
	delay := s.cfg.PeerDelay
	if delay <= 0 {
		delay = DefaultPeerDelay
	}
	s.push(event{t: now + int64(delay), kind: evPeerArrive, pm: m})
	r.sched.Sent(time.Duration(now))
	r.due = -1
	if s.q.more() {
		r.due = int64(r.sched.Next())
		s.push(event{t: r.due, kind: evPeers, w: int32(i)})
	}
}

// receiveLoad applies m at every other router: the sender's loads replace
// its last ones in the receiver's SetPeers, its prefix records are stored
// in the receiver's approximate index (peers.Config.OnPrefixes).
func (s *sim) receiveLoad(m *peerMsg, now int64) {
	for j, r := range s.routers {
		if j == m.from {
			continue
		}
		if m.loads != nil {
			old := r.heard[m.from]
			for k, l := range m.loads {
				var o peers.EngineLoad
				if old != nil {
					o = old[k]
				}
				r.sum[k].InFlight += l.InFlight - o.InFlight
				r.sum[k].PendingPrefill += l.PendingPrefill - o.PendingPrefill
				r.ws[k].Live.SetPeers(r.sum[k].InFlight, r.sum[k].PendingPrefill)
			}
			r.heard[m.from] = m.loads
		}
		for _, p := range m.prefixes {
			_ = r.src.approx.Store(p.Engine, prefixindex.TierGPU, p.Keys, now)
		}
	}
}

// wireID is a stand-in for worker k's Consul service id as long as the
// ids Nomad registers (_nomad-task-<alloc id>-<group>-<task>-<service>-<port>).
func wireID(k int) string {
	return fmt.Sprintf("_nomad-task-%08x-0000-4000-8000-000000000000-engine-vllm-oasis-engine-http", k)
}

// workerIndex is the index of the worker with id.
func (s *sim) workerIndex(id string) int {
	for _, w := range s.workers {
		if w.id == id {
			return int(w.idx)
		}
	}
	return -1
}

// routersResult fills the routers' part of r.
func (s *sim) routersResult(r *Result) {
	if s.routers == nil {
		return
	}
	r.Routers, r.ShareLoads, r.SharePrefixes, r.PrefixDrops = len(s.routers), s.cfg.ShareLoads, s.cfg.SharePrefixes, s.prefixDrops
	r.ShareSignals, r.PeerMessages, r.PeerBytes = s.cfg.ShareSignals, s.peerMessages, s.peerBytes
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
