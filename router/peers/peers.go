// Package peers shares load among the routers of one datacenter (the Nomad
// system job runs one per node), so that a model's max_in_flight and a key's
// rate limit hold for the datacenter, not for each router.
//
// Routers find each other through their Consul registrations (service
// oasis-router, the gossip address in meta MetaAddr, which the router writes
// with -register or the Nomad job's service block does) and join a
// memberlist cluster; a router is known by its gossip address, so a
// registration and a gossip member with the same address are one router:
// membership and failure detection are memberlist's (SWIM). Each router
// sends its Load to every member it knows as soon as its own requests on an
// engine change (Changed), at most once per MinInterval, and at least every
// Interval (Schedule). The
// routers budgets are split over are the union of the gossip members alive
// and the passing Consul registrations: a router cut off from gossip but
// still registered keeps counting, so its peers never hand out its part, and
// it keeps its own share (never the whole budget). ARCHITECTURE.md ("What
// the routers share") states the staleness and the resulting overshoot.
package peers

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/router/metrics"
)

// Defaults.
const (
	DefaultService  = "oasis-router"
	DefaultBind     = "127.0.0.1:0"
	DefaultInterval = 200 * time.Millisecond
	// DefaultMinInterval is the shortest time between two load messages
	// of one router (bench/cluster measures the choice: BENCHMARKS.md,
	// "Routers of a datacenter").
	DefaultMinInterval = 10 * time.Millisecond
	// MaxInterval bounds Interval: StaleAfter must outlast a few of them.
	MaxInterval       = 10 * time.Second
	DefaultStaleAfter = 2 * time.Second
	// MetaAddr is the Consul service meta key of a router's gossip address.
	MetaAddr = "oasis_peers"
	// MetaNode is the Consul service meta key of the Nomad node a router
	// runs on (the system job's service blocks set it): registrations
	// with one node are one router (its API and its mesh listener).
	MetaNode = "oasis_node"
)

// Errors of New.
var (
	ErrConfig = errors.New("invalid peers configuration")
	// ErrInsecure is a gossip listener off loopback without a key.
	ErrInsecure = errors.New("peers: a gossip key is required when binding beyond loopback")
)

// Config configures Peers.
type Config struct {
	// Name is this router's gossip node name, unique in the datacenter
	// (required; the router passes its Consul service id).
	Name string
	// CountOnly runs no gossip: this router only counts the datacenter's
	// live routers from their Consul registrations and keeps its even
	// share of every budget (ModelShare, KeyFraction), as a router cut
	// off from its peers does. Bind, Advertise and Key are then unused.
	CountOnly bool
	// With CountOnly, this router's own registrations (not to be counted
	// twice) are the one with the service id Name (-register), those with
	// meta MetaNode equal to Node (the Nomad node id the job renders), and
	// those on this router's Consul agent's node at one of Ports, its API
	// ports (when the token may read the agent).
	Node  string
	Ports []int
	// Bind is the gossip listener, TCP and UDP on one port (default
	// DefaultBind: loopback, any free port).
	Bind string
	// Advertise is the address peers reach Bind at (default: Bind's
	// address once bound).
	Advertise string
	// Key encrypts gossip (AES-GCM, 16, 24 or 32 bytes); unencrypted
	// messages are then refused. Required unless Bind is loopback.
	Key []byte
	// Consul finds the peers (required).
	Consul *consulapi.Client
	// Service is the routers' Consul service (default DefaultService).
	Service string
	// Local is this router's load, asked for each message (required;
	// called without locks held).
	Local func() Load
	// OnChange is called after a peer's load or the set of live routers
	// changed (from Run's goroutine).
	OnChange func()
	// OnPrefixes, when set, is given each prefix record a peer sent
	// (Routed there): an event-less engine's id and the keys it was sent
	// (called without locks held, from memberlist's goroutine).
	OnPrefixes func(engine string, keys []uint64)
	// Interval is the longest time between two load messages: sent
	// without a change, they are the heartbeat (default DefaultInterval).
	Interval time.Duration
	// MinInterval is the shortest time between two load messages: changes
	// within it go out together (default DefaultMinInterval; at most
	// Interval).
	MinInterval time.Duration
	// StaleAfter: a peer's load older than this is unknown (default
	// DefaultStaleAfter, or 10 × Interval when longer; at least 2 ×
	// Interval).
	StaleAfter time.Duration

	Logger  hclog.Logger     // nil: no logs
	Metrics *metrics.Metrics // nil: instruments registered nowhere
	// Registerer, when Metrics is nil, gets the instruments.
	Registerer prometheus.Registerer
}

// Peers is this router's view of its datacenter's routers.
type Peers struct {
	cfg     Config
	log     hclog.Logger
	m       *metrics.Metrics
	ml      *memberlist.Memberlist
	changed chan struct{}
	dirty   chan struct{} // Changed: this router's load changed
	closed  atomic.Bool

	mu         sync.Mutex
	self       string            // this router's key in the split: its gossip address (Addr); with CountOnly its registration's regKey
	gossip     map[string]string // alive gossip members but this one: name → address
	registered map[string]string // passing Consul registrations by router (regKey) → gossip address ("" without)
	members    []member          // live's answer, nil when gossip or registered changed
	selfAt     int
	loads      map[string]received // by name
	sent       Load                // this router's load as last broadcast
	prevSent   Load                // and the time before
	caps       map[string]int      // each model's max_in_flight, as ModelShare was last asked
	// granted is, per model, the largest part ModelShare returned since
	// the last broadcast: admission may have filled it after Local's
	// snapshot, so the next message reports at least that much.
	granted map[string]int
	// out are the prefix records (Routed) for the next broadcast.
	out Outbox
}

type received struct {
	seq  uint64
	at   time.Time
	load Load
}

// New validates cfg and binds the gossip listener; Run joins the peers.
func New(cfg Config) (*Peers, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Peers{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, changed: make(chan struct{}, 1), dirty: make(chan struct{}, 1),
		gossip: map[string]string{}, registered: map[string]string{}, loads: map[string]received{}, caps: map[string]int{},
		granted: map[string]int{}}
	p.m.PeersLive.Set(1)
	if cfg.CountOnly {
		p.self = "self:" + cfg.Name
		p.m.PeersGossip.Set(0) // no gossip at all
		return p, nil
	}
	p.m.PeersGossip.Set(1)
	mc, err := p.memberlistConfig()
	if err != nil {
		return nil, err
	}
	if p.ml, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("peers: starting gossip on %s: %w", cfg.Bind, err)
	}
	p.self = p.Addr()
	return p, nil
}

func (c Config) withDefaults() (Config, error) {
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Metrics == nil {
		reg := c.Registerer
		if reg == nil {
			reg = prometheus.NewRegistry()
		}
		c.Metrics = metrics.New(reg)
	}
	if c.Bind == "" {
		c.Bind = DefaultBind
	}
	if c.Service == "" {
		c.Service = DefaultService
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.MinInterval == 0 {
		c.MinInterval = min(DefaultMinInterval, c.Interval)
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = max(DefaultStaleAfter, 10*c.Interval)
	}
	switch {
	case c.Name == "" || len(c.Name) > maxNameBytes:
		return c, fmt.Errorf("%w: Name: want 1 to %d bytes", ErrConfig, maxNameBytes)
	case c.Consul == nil:
		return c, fmt.Errorf("%w: Consul is required", ErrConfig)
	case c.Local == nil:
		return c, fmt.Errorf("%w: Local is required", ErrConfig)
	case c.Interval < 0 || c.Interval > MaxInterval:
		return c, fmt.Errorf("%w: Interval: want up to %v, got %v", ErrConfig, MaxInterval, c.Interval)
	case c.MinInterval < 0 || c.MinInterval > c.Interval:
		return c, fmt.Errorf("%w: MinInterval: want from 0 to Interval (%v), got %v", ErrConfig, c.Interval, c.MinInterval)
	case c.StaleAfter < 2*c.Interval:
		return c, fmt.Errorf("%w: StaleAfter: want at least twice Interval (%v), got %v", ErrConfig, c.Interval, c.StaleAfter)
	case c.Key != nil && len(c.Key) != 16 && len(c.Key) != 24 && len(c.Key) != 32:
		return c, fmt.Errorf("%w: Key: want 16, 24 or 32 bytes, got %d", ErrConfig, len(c.Key))
	}
	host, _, err := net.SplitHostPort(c.Bind)
	if err != nil {
		return c, fmt.Errorf("%w: Bind: %w", ErrConfig, err)
	}
	if ip := net.ParseIP(host); !c.CountOnly && c.Key == nil && (ip == nil || !ip.IsLoopback()) {
		return c, ErrInsecure
	}
	return c, nil
}

// memberlistConfig is memberlist's LAN-local profile (probes every second,
// a dead member declared within a few seconds) on Bind.
func (p *Peers) memberlistConfig() (*memberlist.Config, error) {
	mc := memberlist.DefaultLocalConfig()
	mc.Name = p.cfg.Name
	host, port, err := splitPort(p.cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("%w: Bind: %w", ErrConfig, err)
	}
	mc.BindAddr, mc.BindPort = host, port
	if p.cfg.Advertise != "" {
		if mc.AdvertiseAddr, mc.AdvertisePort, err = splitPort(p.cfg.Advertise); err != nil {
			return nil, fmt.Errorf("%w: Advertise: %w", ErrConfig, err)
		}
	}
	if p.cfg.Key != nil {
		mc.SecretKey = p.cfg.Key
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Delegate = delegate{p}
	mc.Events = events{p}
	mc.Logger = p.log.Named("memberlist").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	return mc, nil
}

func splitPort(hostport string) (string, int, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q: want 0 to 65535", ps)
	}
	return host, port, nil
}

// Addr is the gossip address peers reach this router at (register it as
// meta MetaAddr); "" with CountOnly.
func (p *Peers) Addr() string {
	if p.ml == nil {
		return ""
	}
	n := p.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Close leaves the gossip cluster and stops its listener.
func (p *Peers) Close() error {
	if p.closed.Swap(true) || p.ml == nil {
		return nil
	}
	err := p.ml.Leave(time.Second)
	return errors.Join(err, p.ml.Shutdown())
}

// Changed tells Peers that this router's load changed (a request began or
// ended on an engine, its first token came, a prefix record was queued):
// Run sends the load as Schedule allows. It never blocks.
func (p *Peers) Changed() {
	select {
	case p.dirty <- struct{}{}:
	default:
	}
}

// notify asks Run to call OnChange.
func (p *Peers) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// member is one router of the split: key orders the split and tells
// routers apart (its gossip address, or "consul:<service id>" for a
// registration without one); name is its gossip name ("" when it does not
// gossip with this one).
type member struct{ key, name string }

// live is every router budgets are split over, sorted by key, with this
// one's index: this router, the gossip members alive and the passing
// Consul registrations (one router when its registration's gossip address
// is a member's). Caller holds p.mu.
func (p *Peers) live() ([]member, int) {
	if p.members == nil {
		p.members, p.selfAt = p.computeLive()
	}
	return p.members, p.selfAt
}

// computeLive builds live's answer. Caller holds p.mu.
func (p *Peers) computeLive() ([]member, int) {
	set := map[string]string{p.self: p.cfg.Name}
	for name, addr := range p.gossip {
		set[addr] = name
	}
	for id, addr := range p.registered {
		key := addr
		if key == "" {
			key = "consul:" + id
		}
		if p.cfg.CountOnly {
			key = id // one key space: regKey's
		}
		if _, ok := set[key]; !ok {
			set[key] = ""
		}
	}
	ms := make([]member, 0, len(set))
	for key, name := range set {
		ms = append(ms, member{key: key, name: name})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].key < ms[j].key })
	return ms, sort.Search(len(ms), func(i int) bool { return ms[i].key >= p.self })
}

// Live is the number of routers budgets are split over, this one included.
func (p *Peers) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	ms, _ := p.live()
	return len(ms)
}

// fresh is name's load when it is recent. Caller holds p.mu.
func (p *Peers) fresh(name string, now time.Time) (Load, bool) {
	if name == "" {
		return Load{}, false
	}
	r, ok := p.loads[name]
	if !ok || now.Sub(r.at) > p.cfg.StaleAfter {
		return Load{}, false
	}
	return r.load, true
}

// ModelShare is how many of model's limit in-flight requests
// (max_in_flight) this router may run: its part of the split of limit over the live routers in proportion to
// demand (allocate), and never more than limit less, for each other router,
// the largest of its reported in-flight, its reported part and its part now
// (shareOf). Every router computes the split from the loads last broadcast,
// its own included, so routers that received the same messages agree and
// the parts sum to limit. limit ≤ 0 (no cap) is returned as is.
func (p *Peers) ModelShare(model string, limit int) int {
	if limit <= 0 {
		return limit
	}
	p.mu.Lock()
	if len(p.caps) < maxEntries || p.caps[model] != 0 {
		p.caps[model] = limit
	}
	share := p.shareLocked(model, limit, time.Now())
	if _, ok := p.caps[model]; ok {
		p.granted[model] = max(p.granted[model], share)
	}
	p.mu.Unlock()
	p.m.AdmissionShare.WithLabelValues(model).Set(float64(share))
	return share
}

// shareLocked is ModelShare's split, computed with this router's demand
// as it broadcast it last and the time before, the smaller part kept: a
// router's part grows only once the demand that grows it has been out for
// an interval (its peers have it), while it shrinks at once. Caller holds
// p.mu.
func (p *Peers) shareLocked(model string, limit int, now time.Time) int {
	ms, self := p.live()
	cs := make([]claim, len(ms))
	for i, m := range ms {
		cs[i].name = m.key
		if l, ok := p.fresh(m.name, now); ok && i != self {
			ml := l.Models[model]
			cs[i] = claim{name: m.key, demand: float64(ml.InFlight + ml.Queued), known: true, used: ml.InFlight, share: ml.Share,
				waiting: ml.Queued > 0, band: ml.Band}
		}
	}
	share := limit
	for _, own := range []Load{p.sent, p.prevSent} {
		ml := own.Models[model]
		cs[self] = claim{name: p.self, demand: float64(ml.InFlight + ml.Queued), known: true, waiting: ml.Queued > 0, band: ml.Band}
		share = min(share, shareOf(limit, self, byBand(cs)))
	}
	return share
}

// EngineLoads are the other live routers' requests per engine instance,
// summed, from their fresh loads.
func (p *Peers) EngineLoads() map[string]EngineLoad {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]EngineLoad{}
	for name := range p.gossip {
		l, ok := p.fresh(name, now)
		if !ok {
			continue
		}
		for id, e := range l.Engines {
			sum := out[id]
			sum.InFlight += e.InFlight
			sum.PendingPrefill += e.PendingPrefill
			out[id] = sum
		}
	}
	return out
}

// KeyFraction is this router's part of key id's rate limit: (1 + the rate
// it saw the key at) over the sum of (1 + rate) of every live router, from
// the loads last broadcast (an unknown router's rate taken as this one's).
func (p *Peers) KeyFraction(id string) float64 {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	ms, self := p.live()
	cs := make([]claim, len(ms))
	for i, m := range ms {
		l, ok := p.fresh(m.name, now)
		if i == self {
			l, ok = p.sent, true
		}
		if ok {
			cs[i].demand, cs[i].known = l.Keys[id], true
		}
	}
	// A router whose load is unknown is taken to see the key as this one
	// does: cut off from its peers, a router keeps 1 ÷ routers of the rate.
	for i := range cs {
		if !cs[i].known {
			cs[i].demand = cs[self].demand
		}
	}
	return fractionOf(self, cs)
}
