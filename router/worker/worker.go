// Package worker is the router's engine instance: Worker, what discovery
// found (the instance's address, model, role and capacities), and Live, what
// the router learns of it while serving (load, engine metrics, power, prefill
// rate, connection failures). Every layer imports it to name a worker:
// discovery builds Workers, enginestats and the gateway update their Live,
// scoring chooses among them.
package worker

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/router/prefixindex"
)

// Worker is one engine instance serving one model, as discovered in Consul or
// Nomad. The descriptive fields never change for the life of a Worker value;
// Live is shared between successive discovery snapshots of the same instance
// (same ID) so signals survive pool updates.
type Worker struct {
	ID     string // service instance id, unique in the cluster
	Model  string // oasis_model
	Engine string // oasis_engine: vllm|sglang|llama_cpp|trtllm|openai_compat|sim
	Role   string // oasis_role: both|prefill|decode
	// PDProtocol is how a prefill and a decode worker hand a request over
	// (oasis_pd_protocol): "vllm" (kv_transfer_params) or "sglang" (bootstrap).
	PDProtocol string
	// BootstrapPort is an SGLang prefill worker's bootstrap server port
	// (oasis_bootstrap_port); 0 if none.
	BootstrapPort    int
	Address          string // host:port of the OpenAI API
	Node             string // oasis_node: Nomad node id
	BlockSize        int    // oasis_block_size, tokens per KV block (0 if unknown)
	KVEventsEndpoint string // oasis_kv_events, e.g. tcp://10.0.0.1:5557; "" if none
	KVEventsReplay   string // oasis_kv_events_replay: the events' replay ROUTER endpoint; "" if none
	MetricsPath      string // oasis_metrics_path, e.g. /metrics; "" for a hosted endpoint
	// KVCapacity is the engine's KV cache in blocks per tier
	// (oasis_kv_capacity); zero when it advertises none.
	KVCapacity prefixindex.Capacity
	Tags       []string
	// Upstream is a hosted OpenAI-compatible API's base URL (oasis_upstream, e.g.
	// https://api.example.com/v1): requests go there instead of to Address.
	Upstream string
	// UpstreamKey is the hosted API's key, read from the router's environment variable named in
	// oasis_upstream_key_env. Secret: never log a Worker's fields wholesale.
	UpstreamKey string
	// Names are the further names the engine serves Model under
	// (oasis_served_names: vLLM's other --served-model-name values); the
	// router routes each like Model, in the same KV cache domain.
	Names []string
	// Adapters are the LoRA adapters the engine serves (oasis_lora_adapters:
	// vLLM's --lora-modules names), each routable by its name; an adapter's
	// KV blocks are a domain of their own.
	Adapters []string
	// Loadable are the LoRA adapters the engine can load on demand
	// (oasis_lora_loadable: vLLM with runtime LoRA updating): the router
	// loads one (POST /v1/load_lora_adapter) before the first request it
	// sends there naming it (router/gateway/adapters.go).
	Loadable []LoRA

	Live *Live
}

// LoRA is an adapter an engine can load: its name and where from (a
// directory on the engine's host or a Hugging Face repository id).
type LoRA struct{ Name, Path string }

// LoadablePath returns the path of name when it is one of w's loadable
// adapters.
func (w *Worker) LoadablePath(name string) (string, bool) {
	for _, l := range w.Loadable {
		if l.Name == name {
			return l.Path, true
		}
	}
	return "", false
}

// Served returns every name w is routable by: Model, Names, Adapters and
// Loadable's.
func (w *Worker) Served() []string {
	if len(w.Names) == 0 && len(w.Adapters) == 0 && len(w.Loadable) == 0 {
		return []string{w.Model}
	}
	out := make([]string, 0, 1+len(w.Names)+len(w.Adapters)+len(w.Loadable))
	out = append(out, w.Model)
	out = append(out, w.Names...)
	out = append(out, w.Adapters...)
	for _, l := range w.Loadable {
		out = append(out, l.Name)
	}
	return out
}

// Adapter returns name when it is one of w's LoRA adapters, else "": the
// LoRA part of the KV cache domain of a request naming name.
func (w *Worker) Adapter(name string) string {
	for _, a := range w.Adapters {
		if a == name {
			return name
		}
	}
	if _, ok := w.LoadablePath(name); ok {
		return name
	}
	return ""
}

// Signals returns the worker's current live signals. A Worker without Live
// (built by hand in a test) reports zero load and no engine metrics.
func (w *Worker) Signals() Signals {
	if w.Live == nil {
		return Signals{}
	}
	return w.Live.Snapshot()
}

// Signals is a point-in-time copy of what the router knows about a worker's load.
type Signals struct {
	// Tracked by the router itself, always current.
	InFlight       int64 // requests this router has sent and not finished
	InFlightTokens int64 // estimated prompt+max output tokens of those requests

	// The datacenter's other routers (router/peers), as they last said
	// (at most one gossip interval old): their requests in flight to the
	// worker and their pending prefill tokens on it. Load and
	// EstimatedTTFT add them.
	PeerInFlight             int64
	PeerPendingPrefillTokens int64

	// The router's prefill model (StartPrefill): uncached prompt tokens sent
	// and not yet answered with a first token, and the learned rate at which
	// the worker gets through them (DefaultPrefillRate until measured).
	PendingPrefillTokens int64
	PrefillRate          float64 // tokens per second

	// Scraped from the engine's metrics endpoint; valid when EngineMetrics.
	EngineMetrics bool
	Running       float64 // requests the engine is running (all clients)
	Waiting       float64 // requests queued in the engine
	KVUsage       float64 // fraction of KV cache blocks in use, 0..1
	ScrapedAt     time.Time

	// Power efficiency; valid when HasPower.
	HasPower       bool
	PowerWatts     float64 // GPU power attributed to this worker
	TokensPerJoule float64 // smoothed generated tokens per joule
	// SeqTokensPerJoule is the smoothed tokens per joule per running sequence
	// (each interval's tokens per joule over the sequences it ran): what one
	// sequence's share of a step yields on this GPU (see PowerTerm).
	SeqTokensPerJoule float64
	GenTokensPerSec   float64 // recent generation throughput
}

// Load is the number of requests occupying the worker: the in-flight count
// of this router and its peers, or what the engine reports running+waiting
// when that is larger (other clients share the engine).
func (s Signals) Load() float64 {
	l := float64(s.InFlight + max(s.PeerInFlight, 0))
	if s.EngineMetrics {
		l = math.Max(l, s.Running+s.Waiting)
	}
	return l
}

// Live holds a worker's mutable signals. It is safe for concurrent use: the
// proxy updates in-flight counters on every request, the scraper updates
// engine figures on its own schedule.
type Live struct {
	inFlight       atomic.Int64
	inFlightTokens atomic.Int64
	generated      atomic.Int64 // completion tokens from engine usage objects
	prefill        prefillState
	attached       atomic.Value // Attach's value
	unreachable    atomic.Int32 // connect failures in a row (eject.go)
	peerInFlight   atomic.Int64 // SetPeers
	peerPending    atomic.Int64
	ejectedUntil   atomic.Int64 // unix ns; the worker is out of routing before it
	onChange       atomic.Pointer[func()]

	mu sync.RWMutex
	s  Signals // engine and power fields only
}

// Attach keeps v with the worker's live state, for a caller that needs
// per-worker state of its own on every request (the gateway's metric
// series) without a map lookup; Attached returns it, nil before any Attach.
// Every Attach to one Live must pass the same concrete type.
func (l *Live) Attach(v any) { l.attached.Store(v) }

// Attached returns what Attach stored last, or nil.
func (l *Live) Attached() any { return l.attached.Load() }

// NewLive returns empty live signals.
func NewLive() *Live { return &Live{} }

// OnChange sets f to be called after this router's own requests on the
// worker change: Begin, Enter and their ends, StartPrefill, and a
// prefill's FirstToken or Cancel (router/peers sends the load to the
// datacenter's other routers on change). f runs on the caller's goroutine
// and must not block; nil removes it.
func (l *Live) OnChange(f func()) {
	if f == nil {
		l.onChange.Store(nil)
		return
	}
	l.onChange.Store(&f)
}

// changed calls OnChange's function.
func (l *Live) changed() {
	if f := l.onChange.Load(); f != nil {
		(*f)()
	}
}

// SetPeers sets what the datacenter's other routers have in flight to the
// worker and their pending prefill tokens on it (router/peers).
func (l *Live) SetPeers(inFlight, pendingPrefill int64) {
	l.peerInFlight.Store(max(inFlight, 0))
	l.peerPending.Store(max(pendingPrefill, 0))
}

// Begin records a request sent to the worker; call the returned func when it ends.
func (l *Live) Begin(tokens int64) (end func()) {
	l.inFlight.Add(1)
	l.inFlightTokens.Add(tokens)
	l.changed()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.inFlight.Add(-1)
			l.inFlightTokens.Add(-tokens)
			l.changed()
		})
	}
}

// Enter is Begin without the end closure: Leave(tokens) must follow exactly once.
func (l *Live) Enter(tokens int64) {
	l.inFlight.Add(1)
	l.inFlightTokens.Add(tokens)
	l.changed()
}

// Leave ends what Enter(tokens) began.
func (l *Live) Leave(tokens int64) {
	l.inFlight.Add(-1)
	l.inFlightTokens.Add(-tokens)
	l.changed()
}

// AddGenerated counts completion tokens an engine reported in a usage object.
func (l *Live) AddGenerated(n int64) { l.generated.Add(n) }

// Generated returns the completion tokens counted by AddGenerated.
func (l *Live) Generated() int64 { return l.generated.Load() }

// SetEngine stores freshly scraped engine metrics.
func (l *Live) SetEngine(running, waiting, kvUsage float64, at time.Time) {
	l.mu.Lock()
	l.s.EngineMetrics = true
	l.s.Running, l.s.Waiting, l.s.KVUsage, l.s.ScrapedAt = running, waiting, kvUsage, at
	l.mu.Unlock()
}

// ClearEngine marks the engine metrics unknown (scrape failed).
func (l *Live) ClearEngine() {
	l.mu.Lock()
	l.s.EngineMetrics = false
	l.mu.Unlock()
}

// SetPower stores the worker's power figures.
func (l *Live) SetPower(watts, tokensPerSec, tokensPerJoule, seqTokensPerJoule float64) {
	l.mu.Lock()
	l.s.HasPower = true
	l.s.PowerWatts, l.s.GenTokensPerSec, l.s.TokensPerJoule, l.s.SeqTokensPerJoule = watts, tokensPerSec, tokensPerJoule, seqTokensPerJoule
	l.mu.Unlock()
}

// Snapshot copies the current signals.
func (l *Live) Snapshot() Signals {
	l.mu.RLock()
	s := l.s
	l.mu.RUnlock()
	s.InFlight = l.inFlight.Load()
	s.InFlightTokens = l.inFlightTokens.Load()
	s.PendingPrefillTokens = l.prefill.pending.Load()
	s.PeerInFlight = l.peerInFlight.Load()
	s.PeerPendingPrefillTokens = l.peerPending.Load()
	s.PrefillRate = l.prefill.rate()
	return s
}

// DefaultBlockSize is assumed for workers that do not advertise oasis_block_size.
const DefaultBlockSize = 16

// BlockSizeOf is w's KV block size in tokens: oasis_block_size, else
// DefaultBlockSize.
func BlockSizeOf(w *Worker) int {
	if w.BlockSize > 0 {
		return w.BlockSize
	}
	return DefaultBlockSize
}
