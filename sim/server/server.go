// Package server is oasis-sim's vLLM-compatible HTTP server: the OpenAI endpoints,
// /tokenize, /detokenize, /health, /metrics and /version, in front of a sim/engine
// Engine that it drives in (scaled) real time.
package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/sim/engine"
)

// Config configures a Server.
type Config struct {
	// Model is the positional MODEL argument; ServedModelNames default to it.
	Model            string
	ServedModelNames []string
	// LoRAModules are LoRA adapters served by name (vLLM's --lora-modules):
	// requests may name them, /v1/models lists them with parent. The sim
	// generates for an adapter as for the base model, in the same prefix cache.
	LoRAModules []LoRAModule
	// RuntimeLoRA serves POST /v1/load_lora_adapter and
	// /v1/unload_lora_adapter (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING).
	RuntimeLoRA bool
	// MaxModelLen bounds prompt + completion tokens (default 8192... see cli).
	MaxModelLen int
	// Speed scales simulated time: 1 real time, 2 twice as fast, 0 no waiting at all.
	Speed float64
	// Seed makes unseeded requests' outputs reproducible across runs.
	Seed   uint64
	Engine engine.Config
	Power  engine.PowerModel
	// KVEvents, when non-nil, publishes KV events (Engine.KVEvents is set for it).
	KVEvents *kvevents.PublisherConfig
	// KVTransfer is set when a --kv-transfer-config connector is configured: prefill
	// legs then answer with kv_transfer_params.
	KVTransfer bool
	// Host is what kv_transfer_params report as remote_host unless
	// PD.SideChannelHost is set.
	Host string
	// PD configures disaggregated prefill/decode (vLLM's NIXL handshake, SGLang's
	// bootstrap rooms) and the KV transfer model.
	PD      PDConfig
	Version string
	// APIKey, when set, is required as "Authorization: Bearer KEY" on /v1 endpoints
	// (vLLM's --api-key); it is never logged.
	APIKey string
	Logger hclog.Logger
}

// Server serves the API and drives the engine.
type Server struct {
	cfg       Config
	log       hclog.Logger
	modelName string // first served name: metrics label and response "model" default
	served    map[string]bool
	vocab     *vocab
	metrics   *metrics
	pub       *kvevents.Publisher
	created   int64
	seedHash  maphash.Seed
	start     time.Time

	mu        sync.Mutex
	eng       *engine.Engine
	streams   map[string]*stream
	nextID    uint64
	stepClock time.Duration // simulated time at speed 0: the sum of step durations
	busy      engine.BusyTracker
	wake      chan struct{}

	kv        *kvStore       // prefill legs' KV held for decode legs
	client    *http.Client   // decode legs' side-channel pulls
	responses *responseStore // stored Responses API responses (responses.go)
	loras     runtimeLoRAs   // adapters loaded at run time (lora.go)
}

// LoRAModule is a LoRA adapter the sim serves: its name and the path vLLM
// would load it from (reported as its root in /v1/models).
type LoRAModule struct{ Name, Path string }

// stream is one in-flight request as the driver sees it.
type stream struct {
	id      string
	gen     *generation
	arrival time.Duration // simulated time
	last    time.Duration
	prompt  int
	remote  bool // the prompt's KV came from a prefill engine

	mu     sync.Mutex
	outs   []engine.Output
	done   bool
	signal chan struct{}
}

func (st *stream) push(o engine.Output) {
	st.mu.Lock()
	st.outs = append(st.outs, o)
	if o.Finished {
		st.done = true
	}
	st.mu.Unlock()
	select {
	case st.signal <- struct{}{}:
	default:
	}
}

// take returns the outputs delivered so far (into buf) and whether the last came.
func (st *stream) take(buf []engine.Output) ([]engine.Output, bool) {
	st.mu.Lock()
	buf = append(buf[:0], st.outs...)
	st.outs = st.outs[:0]
	done := st.done
	st.mu.Unlock()
	return buf, done
}

// New builds a server and binds its KV-event sockets; call Run to drive the
// engine, Handler to serve HTTP, and Close to release the sockets.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Model == "" {
		return nil, errors.New("model is required")
	}
	if len(cfg.ServedModelNames) == 0 {
		cfg.ServedModelNames = []string{cfg.Model}
	}
	if cfg.Speed < 0 {
		return nil, fmt.Errorf("speed %v: must not be negative", cfg.Speed)
	}
	if cfg.Power == (engine.PowerModel{}) {
		cfg.Power = engine.DefaultPower()
	}
	cfg.Engine.KVEvents = cfg.KVEvents != nil
	eng, err := engine.New(cfg.Engine)
	if err != nil {
		return nil, err
	}
	if err := cfg.PD.fill(); err != nil {
		return nil, err
	}
	if cfg.MaxModelLen <= 0 {
		cfg.MaxModelLen = 8192
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		modelName: cfg.ServedModelNames[0],
		served:    map[string]bool{},
		vocab:     newVocab(),
		created:   time.Now().Unix(),
		seedHash:  maphash.MakeSeed(),
		start:     time.Now(),
		eng:       eng,
		streams:   map[string]*stream{},
		wake:      make(chan struct{}, 1),
		kv:        newKVStore(),
		client:    &http.Client{},
		responses: newResponseStore(),
	}
	for _, n := range cfg.ServedModelNames {
		s.served[n] = true
	}
	for _, m := range cfg.LoRAModules {
		s.served[m.Name] = true
	}
	s.metrics = newMetrics(s)
	if cfg.KVEvents != nil {
		pc := *cfg.KVEvents
		pc.Logger = cfg.Logger.Named("kv-events")
		if s.pub, err = kvevents.NewPublisher(pc); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// KVEventsAddr is the bound KV-event endpoint, nil when events are off.
func (s *Server) KVEventsAddr() net.Addr {
	if s.pub == nil {
		return nil
	}
	return s.pub.Addr()
}

// Close releases the KV-event sockets.
func (s *Server) Close() error {
	if s.pub != nil {
		return s.pub.Close()
	}
	return nil
}

// simNow is the simulated time since start. Caller holds s.mu at speed 0.
func (s *Server) simNow() time.Duration {
	if s.cfg.Speed > 0 {
		return time.Duration(float64(time.Since(s.start)) * s.cfg.Speed)
	}
	return s.stepClock
}

func (s *Server) snapshot() (engine.Stats, float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.Stats(), s.busy.Utilization(s.simNow())
}

// simTime is the simulated time now.
func (s *Server) simTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.simNow()
}

// submitOpts are a request's disaggregation settings.
type submitOpts struct {
	remote  bool          // the prompt's KV arrived from a prefill engine
	hold    bool          // keep the KV for a decode engine (a prefill leg)
	arrival time.Duration // simulated arrival, before any KV transfer
	lora    string        // the LoRA adapter the request names ("" for the base model)
}

// adapterOf returns model when it names one of the sim's LoRA adapters
// (from --lora-modules or loaded at run time), else "".
func (s *Server) adapterOf(model string) string {
	for _, m := range s.cfg.LoRAModules {
		if m.Name == model {
			return model
		}
	}
	if _, ok := s.loras.path(model); ok {
		return model
	}
	return ""
}

// submit registers a request with the engine and returns its stream.
func (s *Server) submit(prompt []int32, gen *generation, o submitOpts) (*stream, error) {
	s.mu.Lock()
	s.nextID++
	id := strconv.FormatUint(s.nextID, 36)
	st := &stream{id: id, gen: gen, prompt: len(prompt), remote: o.remote, signal: make(chan struct{}, 1)}
	err := s.eng.Submit(&engine.Request{ID: id, Prompt: prompt, Output: gen.tokens, RemotePrefill: o.remote, HoldKV: o.hold, LoRA: o.lora})
	if err == nil {
		st.arrival = min(o.arrival, s.simNow())
		st.last = s.simNow()
		s.streams[id] = st
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return st, nil
}

// abort removes a request whose client went away; its blocks are freed.
func (s *Server) abort(st *stream) {
	s.mu.Lock()
	_, live := s.streams[st.id]
	if live {
		delete(s.streams, st.id)
		s.eng.Abort(st.id)
	}
	// A prefill leg whose client left after it finished holds blocks nobody will
	// pull: free them now.
	s.eng.ReleaseHeld(st.id)
	s.mu.Unlock()
	if live {
		s.metrics.success.WithLabelValues("abort").Inc()
	}
}

// Run drives the engine until ctx ends, and serves the KV events' replays
// meanwhile; it returns nil then.
func (s *Server) Run(ctx context.Context) error {
	if s.pub != nil {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.pub.Run(ctx) // ends with ctx
		}()
		defer wg.Wait()
	}
	s.drive(ctx)
	return nil
}

// drive steps the engine until ctx ends: step, wait out the step's simulated
// duration (scaled by Speed), publish its KV events, deliver its tokens.
func (s *Server) drive(ctx context.Context) {
	var (
		outs     []engine.Output
		dsts     []*stream
		deadline time.Time
	)
	for {
		s.mu.Lock()
		for !s.eng.HasWork() {
			s.mu.Unlock()
			select {
			case <-s.wake:
			case <-ctx.Done():
				return
			}
			s.mu.Lock()
		}
		res := s.eng.Step()
		dur := res.Duration
		stepStart := s.simNow()
		if s.cfg.Speed == 0 {
			s.stepClock += dur
		}
		s.busy.Add(stepStart, dur)
		outs = append(outs[:0], res.Outputs...)
		dsts = dsts[:0]
		for _, o := range outs {
			st := s.streams[o.ID]
			if o.Finished && st != nil {
				delete(s.streams, o.ID)
			}
			dsts = append(dsts, st)
		}
		events := res.Events
		s.mu.Unlock()

		if s.cfg.Speed > 0 && dur > 0 {
			// Sleep to an absolute deadline so timer overshoot does not accumulate.
			now := time.Now()
			if deadline.Before(now) {
				deadline = now
			}
			deadline = deadline.Add(time.Duration(float64(dur) / s.cfg.Speed))
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		// As vLLM's engine core, which publishes a step's events with its
		// outputs, after the forward pass: a block is reported once computed.
		if len(events) > 0 && s.pub != nil {
			if _, err := s.pub.Publish(kvEventsBatch(events)); err != nil {
				s.log.Warn("publishing kv events failed", "error", err)
			}
		}
		s.deliver(outs, dsts)
	}
}

func (s *Server) deliver(outs []engine.Output, dsts []*stream) {
	var now time.Duration
	if s.cfg.Speed > 0 {
		now = s.simNow()
	} else {
		s.mu.Lock()
		now = s.stepClock
		s.mu.Unlock()
	}
	m := s.metrics
	for i, o := range outs {
		st := dsts[i]
		if st == nil {
			continue // aborted meanwhile
		}
		if o.Index == 0 {
			m.ttft.Observe((now - st.arrival).Seconds())
		} else {
			m.itl.Observe((now - st.last).Seconds())
		}
		st.last = now
		if o.Finished {
			m.e2e.Observe((now - st.arrival).Seconds())
			m.promptTokens.Add(float64(st.prompt))
			m.promptBySource.WithLabelValues(sourceLabel(st.remote)).Add(float64(st.prompt))
			m.genTokens.Add(float64(o.Index + 1))
			m.promptHist.Observe(float64(st.prompt))
			m.genHist.Observe(float64(o.Index + 1))
			m.success.WithLabelValues(st.gen.finishReason).Inc()
		}
		st.push(o)
	}
}

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", s.handleVersion)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	if s.cfg.RuntimeLoRA {
		mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
		mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLoRA)
	}
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("GET /v1/responses/{id}", s.handleResponseGet)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", s.handleResponseCancel)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("POST /detokenize", s.handleDetokenize)
	mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	mux.Handle("GET /metrics", s.metricsHandler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NotFoundError", "Not Found", nil)
	})
	if s.cfg.APIKey == "" {
		return mux
	}
	want := []byte("Bearer " + s.cfg.APIKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1") && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"Unauthorized"}`))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

func kvEventsBatch(events []kvevents.Event) kvevents.EventBatch {
	rank := 0 // single data-parallel rank, as vLLM publishes it
	return kvevents.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events, DataParallelRank: &rank}
}
