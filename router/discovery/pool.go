// Package discovery maintains the router's pool of healthy engine instances
// from Consul's health API or Nomad's native service discovery.
package discovery

import (
	"errors"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/worker"
)

// Service meta keys of the engine convention (ARCHITECTURE.md).
const (
	MetaModel    = "oasis_model"
	MetaEngine   = "oasis_engine"
	MetaRole     = "oasis_role"
	MetaKVEvents = "oasis_kv_events"
	// MetaKVEventsReplay is the replay endpoint (ZMQ ROUTER) of the KV events:
	// a subscriber that missed batches asks it for them instead of resynchronising.
	MetaKVEventsReplay = "oasis_kv_events_replay"
	MetaMetricsPath    = "oasis_metrics_path"
	MetaBlockSize      = "oasis_block_size"
	MetaNode           = "oasis_node"
	// MetaPDProtocol is how the instance takes part in disaggregated
	// prefill/decode: "vllm" or "sglang" (default: "sglang" for engine
	// sglang, else "vllm").
	MetaPDProtocol = "oasis_pd_protocol"
	// MetaBootstrapPort is an SGLang prefill instance's bootstrap server port.
	MetaBootstrapPort = "oasis_bootstrap_port"
	// A hosted endpoint (engine openai_compat): base URL, and the name of the router's
	// environment variable holding its API key (the key never enters Consul).
	MetaUpstream       = "oasis_upstream"
	MetaUpstreamKeyEnv = "oasis_upstream_key_env"
	// MetaServedNames lists, comma-separated, the further names an engine
	// serves its model under (vLLM's other --served-model-name values).
	MetaServedNames = "oasis_served_names"
	// MetaLoRAAdapters lists, comma-separated, the LoRA adapters an engine
	// serves (vLLM's --lora-modules names).
	MetaLoRAAdapters = "oasis_lora_adapters"
	// MetaLoRALoadable lists, comma-separated, name=path of the LoRA
	// adapters an engine can load on demand (vLLM with
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING): the router loads one before the
	// first request naming it.
	MetaLoRALoadable = "oasis_lora_loadable"
)

// EngineService is the service name engines register as.
const EngineService = "oasis-engine"

// KVCachedService is the service name of the node-local KV block stores
// (jobs/kvcached.nomad.hcl), whose presence events the router follows.
const KVCachedService = "oasis-kvcached"

// Instance is one healthy service instance as a source reports it.
type Instance struct {
	ID      string
	Address string // host:port
	Tags    []string
	Meta    map[string]string
}

// Pool is the current set of healthy workers, grouped by model. Readers get
// an immutable view; sources replace it whole.
type Pool struct {
	view atomic.Pointer[view]

	mu     sync.Mutex              // serialises Set
	live   map[string]*worker.Live // by instance id; survives updates
	known  map[string]struct{}     // every model ever seen, to tell 404 from 503
	knownV atomic.Pointer[map[string]struct{}]
	onSet  []func(workers []*worker.Worker)
	synced atomic.Bool // a source has delivered a list

	hosted   *HostedPolicy
	log      hclog.Logger
	metrics  *metrics.Metrics
	rejected map[string]string         // instance id → the refused upstream and key variable, logged once
	self     func(address string) bool // the router's own listeners (Config.IsSelf)
}

// Config configures a Pool; every field is optional.
type Config struct {
	// Hosted is the allow-list of hosted upstreams (nil allows none): an
	// instance whose oasis_upstream or oasis_upstream_key_env it refuses is
	// left out of the pool.
	Hosted *HostedPolicy
	// IsSelf reports the addresses of the router's own listeners: instances
	// there are left out (counted under
	// oasis_router_loops_refused_total{reason="self_address"} and logged,
	// once per instance and address). It is called from Set, by the
	// source's goroutine; hosted workers are judged by their upstream, not
	// their address.
	IsSelf func(address string) bool
	// Logger is where refused instances are reported (default: nowhere).
	Logger hclog.Logger
	// Metrics counts refused instances (nil: not counted).
	Metrics *metrics.Metrics
}

type view struct {
	byModel map[string][]*worker.Worker
	all     []*worker.Worker
}

// New returns an empty pool.
func New(cfg Config) *Pool {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	p := &Pool{live: map[string]*worker.Live{}, known: map[string]struct{}{}, rejected: map[string]string{},
		hosted: cfg.Hosted, self: cfg.IsSelf, log: cfg.Logger, metrics: cfg.Metrics}
	p.view.Store(&view{byModel: map[string][]*worker.Worker{}})
	k := map[string]struct{}{}
	p.knownV.Store(&k)
	return p
}

// OnChange registers fn to be called (synchronously, under the pool's update
// lock) with every new worker list from the next one on. fn must not call
// back into the pool's Set.
func (p *Pool) OnChange(fn func(workers []*worker.Worker)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onSet = append(p.onSet, fn)
}

// Workers returns the healthy workers serving model. The slice is shared: do not modify.
func (p *Pool) Workers(model string) []*worker.Worker { return p.view.Load().byModel[model] }

// All returns every healthy worker.
func (p *Pool) All() []*worker.Worker { return p.view.Load().all }

// Models returns the models with at least one healthy worker, sorted.
func (p *Pool) Models() []string {
	v := p.view.Load()
	out := make([]string, 0, len(v.byModel))
	for m := range v.byModel {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Known reports whether model has ever been served since the router started.
func (p *Pool) Known(model string) bool {
	_, ok := (*p.knownV.Load())[model]
	return ok
}

// Synced reports whether a source has delivered a list since the router
// started. Until then the router knows no models, so an unknown model means
// "not discovered yet" (503), not "not served" (404).
func (p *Pool) Synced() bool { return p.synced.Load() }

// Set replaces the pool with instances. Instances without a model, and
// hosted ones the pool's HostedPolicy refuses, are ignored.
func (p *Pool) Set(instances []Instance) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.synced.Store(true)
	v := &view{byModel: map[string][]*worker.Worker{}}
	seen := make(map[string]struct{}, len(instances))
	newKnown := false
	for _, in := range instances {
		get := metaOf(in)
		if err := p.hosted.Allow(get(MetaUpstream), get(MetaUpstreamKeyEnv)); err != nil {
			p.refuse(in.ID, err)
			continue
		}
		w := workerOf(in.ID, in.Address, in.Tags, get)
		if w.Model == "" || w.Address == "" {
			continue
		}
		if err := p.checkSelf(w); err != nil {
			p.refuse(in.ID, err)
			continue
		}
		if err := checkDisagg(w, get); err != nil {
			p.refuse(in.ID, err)
			continue
		}
		if err := checkMetricsPath(w); err != nil {
			p.refuse(in.ID, err)
			continue
		}
		var err error
		if w.KVCapacity, err = kvCapacityOf(w, get); err != nil {
			p.refuse(in.ID, err)
			continue
		}
		if w.Names, w.Adapters, w.Loadable, err = namesOf(w.Model, get); err != nil {
			p.refuse(in.ID, err)
			continue
		}
		if _, dup := seen[w.ID]; dup {
			continue
		}
		seen[w.ID] = struct{}{}
		l, ok := p.live[w.ID]
		if !ok {
			l = worker.NewLive()
			p.live[w.ID] = l
		}
		w.Live = l
		v.all = append(v.all, w)
		for _, name := range w.Served() {
			v.byModel[name] = append(v.byModel[name], w)
			if _, ok := p.known[name]; !ok {
				p.known[name] = struct{}{}
				newKnown = true
			}
		}
	}
	for id := range p.live {
		if _, ok := seen[id]; !ok {
			delete(p.live, id)
		}
	}
	p.forgetRefused(instances)
	// Stable order so round_robin walks instances predictably.
	for _, ws := range v.byModel {
		slices.SortFunc(ws, func(a, b *worker.Worker) int { return strings.Compare(a.ID, b.ID) })
	}
	if newKnown {
		k := make(map[string]struct{}, len(p.known))
		for m := range p.known {
			k[m] = struct{}{}
		}
		p.knownV.Store(&k)
	}
	p.view.Store(v)
	for _, fn := range p.onSet {
		fn(v.all)
	}
}

// refuse reports a refused instance, once per instance and refused value:
// sources deliver the whole list on every change, and one bad registration
// must not log on each.
func (p *Pool) refuse(id string, err error) {
	if p.refuseSelf(id, err) {
		return
	}
	var me *MetaError
	if errors.As(err, &me) {
		if what := me.Key + "\x00" + me.Value; p.rejected[id] != what {
			p.rejected[id] = what
			p.log.Warn("ignoring engine with invalid service meta", "instance", id, "key", me.Key,
				"value", me.Value, "error", me.Reason)
			if p.metrics != nil {
				p.metrics.MetaRejected.WithLabelValues(me.Key).Inc()
			}
		}
		return
	}
	var he *HostedError
	if !errors.As(err, &he) {
		return
	}
	what := he.Upstream + "\x00" + he.KeyEnv
	if p.rejected[id] == what {
		return
	}
	p.rejected[id] = what
	p.log.Warn("ignoring engine with a hosted upstream the router does not allow (see -hosted-upstreams, -hosted-key-envs)",
		"instance", id, "upstream", he.Upstream, "key_env", he.KeyEnv, "reason", he.Reason())
	if p.metrics != nil {
		p.metrics.HostedRejected.WithLabelValues(he.Reason()).Inc()
	}
}

// forgetRefused drops the refusals of instances no longer listed, so that
// the set stays as small as the registrations and one that returns is
// reported again.
func (p *Pool) forgetRefused(instances []Instance) {
	if len(p.rejected) == 0 {
		return
	}
	listed := make(map[string]struct{}, len(instances))
	for _, in := range instances {
		listed[in.ID] = struct{}{}
	}
	for id := range p.rejected {
		if _, ok := listed[id]; !ok {
			delete(p.rejected, id)
		}
	}
}

// metaOf returns the lookup of an instance's oasis_* values: its meta, or
// tags "oasis_model=x" where a source has no meta.
func metaOf(in Instance) func(string) string {
	return func(k string) string {
		if v, ok := in.Meta[k]; ok {
			return v
		}
		for _, t := range in.Tags {
			if v, ok := strings.CutPrefix(t, k+"="); ok {
				return v
			}
		}
		return ""
	}
}

// workerOf builds the worker of an instance whose hosted upstream, if any,
// the pool's policy allowed.
func workerOf(id, address string, tags []string, get func(string) string) *worker.Worker {
	bs, _ := strconv.Atoi(get(MetaBlockSize))
	upstream := get(MetaUpstream)
	var key string
	if env := get(MetaUpstreamKeyEnv); env != "" {
		key = os.Getenv(env)
	}
	mp := get(MetaMetricsPath)
	if mp == "" && upstream == "" {
		mp = "/metrics"
	}
	role := get(MetaRole)
	if role == "" {
		role = RoleBoth
	}
	proto := get(MetaPDProtocol)
	if proto == "" {
		proto = ProtocolVLLM
		if get(MetaEngine) == "sglang" {
			proto = ProtocolSGLang
		}
	}
	boot, _ := strconv.Atoi(get(MetaBootstrapPort))
	return &worker.Worker{
		ID:               id,
		Model:            get(MetaModel),
		Engine:           get(MetaEngine),
		Role:             role,
		PDProtocol:       proto,
		BootstrapPort:    boot,
		Address:          address,
		Node:             get(MetaNode),
		BlockSize:        bs,
		KVEventsEndpoint: get(MetaKVEvents),
		KVEventsReplay:   get(MetaKVEventsReplay),
		MetricsPath:      mp,
		Tags:             tags,
		Upstream:         upstream,
		UpstreamKey:      key,
	}
}
