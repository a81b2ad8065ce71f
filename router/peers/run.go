package peers

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/memberlist"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
)

// Run watches the routers' Consul registrations, joins their gossip, and
// sends this router's load when Schedule says (on change, at most every
// MinInterval; at least every Interval) until ctx ends; then it leaves the
// cluster (Close).
func (p *Peers) Run(ctx context.Context) error {
	defer p.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); p.watchConsul(ctx) }()
	// Housekeeping: joins (at most once a second) and stale loads.
	tick := time.NewTicker(min(p.cfg.Interval, time.Second))
	defer tick.Stop()
	start := time.Now()
	sched := Schedule{Interval: p.cfg.Interval, MinInterval: p.cfg.MinInterval}
	send := time.NewTimer(0)
	defer send.Stop()
	if p.cfg.CountOnly {
		send.Stop() // no gossip: nothing to send
	}
	lastJoin := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.changed:
			p.changedNow()
		case <-p.dirty:
			if p.cfg.CountOnly {
				continue
			}
			sched.Changed()
			send.Reset(max(sched.Next()-time.Since(start), 0))
		case <-send.C:
			p.broadcast()
			sched.Sent(time.Since(start))
			send.Reset(max(sched.Next()-time.Since(start), 0))
			// This router's own claim in the split changed.
			p.changedNow()
		case now := <-tick.C:
			if now.Sub(lastJoin) >= time.Second && !p.cfg.CountOnly {
				lastJoin = now
				p.join()
			}
			// A peer's load going stale changes the split too.
			p.changedNow()
		}
	}
}

// changedNow updates the gauges and calls OnChange.
func (p *Peers) changedNow() {
	p.mu.Lock()
	ms, _ := p.live()
	g := len(p.gossip) + 1
	if p.cfg.CountOnly {
		g = 0
	}
	p.mu.Unlock()
	p.m.PeersLive.Set(float64(len(ms)))
	p.m.PeersGossip.Set(float64(g))
	if p.cfg.OnChange != nil {
		p.cfg.OnChange()
	}
}

// broadcast sends this router's load to every gossip member: one UDP packet
// when it fits, else over TCP.
func (p *Peers) broadcast() {
	load := p.nextLoad()
	p.mu.Lock()
	prefixes, dropped := p.out.Take()
	p.mu.Unlock()
	if dropped > 0 {
		p.log.Debug("prefix records over a message's bound were dropped", "dropped", dropped, "bound_keys", MaxPrefixKeys)
	}
	msg, err := Encode(p.cfg.Name, uint64(time.Now().UnixNano()), load, prefixes)
	if err != nil {
		p.log.Error("this router's load does not fit a message; not sent", "error", err)
		return
	}
	for _, n := range p.ml.Members() {
		if n.Name == p.cfg.Name {
			continue
		}
		send := p.ml.SendBestEffort
		if len(msg) > bestEffortBytes {
			send = p.ml.SendReliable
		}
		if err := send(n, msg); err != nil {
			p.log.Debug("sending load failed", "peer", n.Name, "error", err)
		}
	}
}

// nextLoad is the load to broadcast, each capped model with this router's
// part under it (the part it keeps to until its next message); it becomes
// this router's own claim in the split.
func (p *Peers) nextLoad() Load {
	load := p.cfg.Local()
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prevSent, p.sent = p.sent, load
	for model, ml := range load.Models {
		if c := p.caps[model]; c > 0 {
			ml.Share = max(p.shareLocked(model, c, now), p.granted[model])
			load.Models[model] = ml
		}
	}
	clear(p.granted)
	return load
}

// join asks memberlist to join the registered routers it does not gossip
// with yet.
func (p *Peers) join() {
	p.mu.Lock()
	known := map[string]bool{p.self: true}
	for _, addr := range p.gossip {
		known[addr] = true
	}
	var addrs []string
	for _, addr := range p.registered {
		if addr != "" && !known[addr] {
			addrs = append(addrs, addr)
		}
	}
	p.mu.Unlock()
	if len(addrs) == 0 {
		return
	}
	if n, err := p.ml.Join(addrs); err != nil {
		p.log.Debug("joining peers", "joined", n, "asked", len(addrs), "error", err)
	}
}

// watchConsul keeps registered equal to the passing registrations of the
// routers' service, with blocking queries. On errors the last view stays:
// a router that cannot reach Consul keeps counting the peers it knew.
func (p *Peers) watchConsul(ctx context.Context) {
	var index uint64
	node, warned := "", false
	for ctx.Err() == nil {
		if node == "" && p.cfg.CountOnly && p.cfg.Node == "" {
			// Needs agent:read; without it only the other rules apply.
			node, _ = p.cfg.Consul.Agent().NodeName()
		}
		q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: time.Minute}).WithContext(ctx)
		entries, meta, err := p.cfg.Consul.Health().Service(p.cfg.Service, "", true, q)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("reading the routers' registrations from Consul failed; keeping the last view", "error", err)
				_ = ctxsleep.Sleep(ctx, time.Second)
			}
			continue
		}
		index = max(meta.LastIndex, 1)
		reg, self := p.registrations(entries, node)
		if p.cfg.CountOnly && self == "" && len(reg) > 0 && !warned {
			warned = true
			p.log.Warn("none of the routers' registrations is this router's: it counts as one more router until one is (registered with -register, with meta oasis_node = -peers-node, or on this Consul agent's node at one of its API ports)",
				"nomad_node", p.cfg.Node, "consul_node", node, "ports", p.cfg.Ports, "registrations", len(reg))
		}
		p.mu.Lock()
		p.registered, p.members = reg, nil
		if self != "" {
			p.self = self
		}
		p.mu.Unlock()
		p.notify()
	}
}

// registrations are the routers entries register, by regKey, with their
// gossip address (a gossip address longer than a host:port is ignored),
// and, with CountOnly, the key of this router's own (isSelf; "" when not
// found): its key in the split, so that all routers order it alike.
func (p *Peers) registrations(entries []*consulapi.ServiceEntry, node string) (map[string]string, string) {
	reg := make(map[string]string, len(entries))
	self := ""
	for _, e := range entries {
		if e.Service == nil || e.Service.ID == "" || len(e.Service.ID) > maxNameBytes {
			continue
		}
		key := regKey(e.Service)
		addr := e.Service.Meta[MetaAddr]
		if _, _, err := net.SplitHostPort(addr); err != nil || len(addr) > maxNameBytes {
			addr = ""
		}
		if addr != "" || reg[key] == "" {
			reg[key] = addr
		}
		if p.cfg.CountOnly && p.isSelf(e, node) {
			self = key
		}
	}
	return reg, self
}

// regKey tells routers apart among the registrations: the Nomad node in
// meta MetaNode (a system job's router registers its API and its mesh
// listener: one router), else the service id.
func regKey(s *consulapi.AgentService) string {
	if n := s.Meta[MetaNode]; n != "" && len(n) <= maxNameBytes {
		return "node:" + n
	}
	return s.ID
}

// isSelf reports whether e is this router's registration: its own service
// id, its Nomad node (Config.Node), or one on this router's Consul agent's
// node at one of its API ports.
func (p *Peers) isSelf(e *consulapi.ServiceEntry, node string) bool {
	if e.Service.ID == p.cfg.Name || (p.cfg.Node != "" && e.Service.Meta[MetaNode] == p.cfg.Node) {
		return true
	}
	if e.Node == nil || node == "" || e.Node.Node != node {
		return false
	}
	for _, port := range p.cfg.Ports {
		if port > 0 && e.Service.Port == port {
			return true
		}
	}
	return false
}

// receive applies a peer's message.
func (p *Peers) receive(b []byte) {
	m, err := decode(b)
	if err == nil && m.Name == p.cfg.Name {
		err = errors.New("a message under this router's own name")
	}
	if err != nil {
		p.m.PeerMessages.WithLabelValues("rejected").Inc()
		p.log.Warn("refused a peer's load message", "error", err)
		return
	}
	p.mu.Lock()
	_, member := p.gossip[m.Name]
	old, seen := p.loads[m.Name]
	if member && (!seen || m.Seq > old.seq) {
		p.loads[m.Name] = received{seq: m.Seq, at: time.Now(), load: m.Load}
	}
	p.mu.Unlock()
	if !member {
		p.m.PeerMessages.WithLabelValues("rejected").Inc()
		return
	}
	p.m.PeerMessages.WithLabelValues("ok").Inc()
	if p.cfg.OnPrefixes != nil {
		for _, pr := range m.Prefixes {
			p.cfg.OnPrefixes(pr.Engine, pr.Keys)
		}
	}
	p.notify()
}

// delegate is memberlist's hook for user messages: the loads.
type delegate struct{ p *Peers }

func (delegate) NodeMeta(int) []byte                    { return nil }
func (d delegate) NotifyMsg(b []byte)                   { d.p.receive(b) }
func (delegate) GetBroadcasts(int, int) [][]byte        { return nil }
func (delegate) LocalState(bool) []byte                 { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool) {}

// events follows membership (called under memberlist's locks: no calls
// back into memberlist here).
type events struct{ p *Peers }

func (e events) NotifyJoin(n *memberlist.Node) {
	if n.Name == e.p.cfg.Name {
		return
	}
	e.p.mu.Lock()
	e.p.gossip[n.Name] = n.Address()
	e.p.members = nil
	e.p.mu.Unlock()
	e.p.log.Info("peer joined", "peer", n.Name, "address", n.Address())
	e.p.notify()
	e.p.Changed() // the new peer gets this router's load now, not at the next heartbeat
}

func (e events) NotifyLeave(n *memberlist.Node) {
	e.p.mu.Lock()
	delete(e.p.gossip, n.Name)
	delete(e.p.loads, n.Name)
	e.p.members = nil
	e.p.mu.Unlock()
	e.p.log.Info("peer left or failed", "peer", n.Name)
	e.p.notify()
}

func (events) NotifyUpdate(*memberlist.Node) {}
