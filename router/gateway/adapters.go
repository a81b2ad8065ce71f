package gateway

// LoRA adapters loaded on demand (issue #36). An engine registered with
// oasis_lora_loadable (name=path) can load those adapters at run time
// (vLLM's POST /v1/load_lora_adapter, with VLLM_ALLOW_RUNTIME_LORA_UPDATING).
// Before the first attempt this router sends to such an engine naming one,
// it loads it there, once (concurrent requests wait for the same load); at
// most Config.MaxLoadedAdapters per engine, the least recently used adapter
// no request of this router is using unloaded (POST /v1/unload_lora_adapter)
// to make room. A load that fails fails the attempt before anything reached
// the client, so the request is retried on another engine.
//
// The routing score prices the load: adapterLoadTime is what an engine would
// need before it starts on a request naming an adapter (0 where loaded, what
// is left of a load under way, else the engine's measured load time), and
// the ttft term adds it to the engine's estimate (scoring.Request.AdapterLoad).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/scoring"
)

// DefaultMaxLoadedAdapters is Config.MaxLoadedAdapters' default.
const DefaultMaxLoadedAdapters = 4

// adapterLoadTimeout bounds one load or unload call.
const adapterLoadTimeout = 2 * time.Minute

// DefaultAdapterLoadTime is the load time the routing score assumes for an
// engine this router has not yet loaded an adapter on: vLLM loads a small
// adapter from local disk in a fraction of a second and one it downloads
// in seconds.
const DefaultAdapterLoadTime = time.Second

// loadTimeDecay is the weight the older load times keep at each new one.
const loadTimeDecay = 0.7

// errAdapterSlots is an engine whose adapter slots are all in use.
var errAdapterSlots = errors.New("every adapter slot this router manages on the engine is in use")

// adapterLoads is what this router loaded on each engine, by instance id.
type adapterLoads struct {
	mu      sync.Mutex
	engines map[string]*engineAdapters
}

// engineAdapters are the adapters loaded on one engine.
type engineAdapters struct {
	loaded  map[string]*loadedAdapter
	loading map[string]*adapterLoad
	// loadTime is the smoothed time a load took on the engine, 0 until one
	// succeeded.
	loadTime time.Duration
	// llama are a llama-server's adapter ids by name (llamalora.go).
	llama map[string]int
}

// adapterLoad is a load under way.
type adapterLoad struct {
	done  chan struct{} // closed when the load ends
	start time.Time
}

type loadedAdapter struct {
	inUse    int
	lastUsed time.Time
}

// useAdapter makes sure x's adapter is loaded on wk when wk lists it as
// loadable, and returns the function that ends this attempt's use of it,
// told the attempt's status: a 404 says the engine no longer has the
// adapter (it restarted under the same instance id, or another router
// unloaded it), so the next request loads it again.
func (g *Gateway) useAdapter(ctx context.Context, x *exchange, wk *scoring.Worker) (func(status int), error) {
	name := x.req.Model
	path, ok := wk.LoadablePath(name)
	if !ok || wk.Upstream != "" || x.remote != nil {
		return func(int) {}, nil
	}
	if g.adapters.size() > 2*len(g.cfg.Pool.All())+16 {
		live := map[string]bool{}
		for _, w := range g.cfg.Pool.All() {
			live[w.ID] = true
		}
		g.adapters.forget(live)
	}
	if wk.Engine == engineLlamaCpp { // applied per request (llamalora.go)
		if _, err := g.llamaLoRAID(ctx, wk, name, path); err != nil {
			return nil, err
		}
		return func(int) {}, nil
	}
	for {
		ea, wait, evict := g.adapters.claim(wk.ID, name, g.cfg.MaxLoadedAdapters)
		switch {
		case wait != nil:
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case ea == nil: // loaded: this use is counted
			return func(status int) { g.adapters.release(wk.ID, name, status == http.StatusNotFound) }, nil
		case evict == errAdapterSlotsName:
			return nil, &upstreamError{err: errAdapterSlots}
		}
		err := g.loadAdapter(ctx, wk, name, path, evict)
		g.adapters.loaded(wk.ID, name, err == nil)
		if err != nil {
			return nil, &upstreamError{err: err}
		}
		g.log.Info("loaded LoRA adapter", "worker", wk.ID, "adapter", name, "evicted", evict)
	}
}

// adapterLoadTime is scoring.Request.AdapterLoad for a request naming
// model: the time a worker that can load model as an adapter needs first
// (adapterLoads.loadTimeOn), 0 for every other worker.
func (g *Gateway) adapterLoadTime(model string) func(*scoring.Worker) time.Duration {
	return func(w *scoring.Worker) time.Duration {
		if _, ok := w.LoadablePath(model); !ok || w.Upstream != "" || w.Engine == engineLlamaCpp {
			return 0
		}
		return g.adapters.loadTimeOn(w.ID, model, g.cfg.MaxLoadedAdapters)
	}
}

// errAdapterSlotsName marks a claim that found no slot.
const errAdapterSlotsName = "\x00full"

// claim counts one use of name on engine id when it is loaded (ea nil);
// returns a channel to wait on while another request loads it; else
// reserves the load for the caller (ea set), naming the adapter to unload
// first ("" for none, errAdapterSlotsName when no slot can be freed).
func (a *adapterLoads) claim(id, name string, max int) (ea *engineAdapters, wait <-chan struct{}, evict string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ea = a.engine(id)
	if l, ok := ea.loaded[name]; ok {
		l.inUse++
		l.lastUsed = time.Now()
		return nil, nil, ""
	}
	if l, ok := ea.loading[name]; ok {
		return nil, l.done, ""
	}
	if len(ea.loaded)+len(ea.loading) >= max {
		if evict = ea.evictable(); evict == "" {
			return ea, nil, errAdapterSlotsName
		}
		delete(ea.loaded, evict)
	}
	ea.loading[name] = &adapterLoad{done: make(chan struct{}), start: time.Now()}
	return ea, nil, evict
}

// engine returns engine id's record, made on first use; a.mu held.
func (a *adapterLoads) engine(id string) *engineAdapters {
	if a.engines == nil {
		a.engines = map[string]*engineAdapters{}
	}
	ea := a.engines[id]
	if ea == nil {
		ea = &engineAdapters{loaded: map[string]*loadedAdapter{}, loading: map[string]*adapterLoad{}}
		a.engines[id] = ea
	}
	return ea
}

// evictable returns the least recently used adapter no request is using,
// "" when every one is in use.
func (ea *engineAdapters) evictable() string {
	var evict string
	var oldest time.Time
	for n, l := range ea.loaded {
		if l.inUse == 0 && (evict == "" || l.lastUsed.Before(oldest)) {
			evict, oldest = n, l.lastUsed
		}
	}
	return evict
}

// loadTimeOn returns how long engine id would take before it can serve
// adapter name: 0 when loaded; what is left of the expected load time
// while a load is under way; the expected load time (measured on the
// engine, else DefaultAdapterLoadTime) when it has a free slot or one to
// free; adapterLoadTimeout when every slot is in use (the attempt would
// fail there).
func (a *adapterLoads) loadTimeOn(id, name string, slots int) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	ea := a.engines[id]
	if ea == nil {
		return DefaultAdapterLoadTime
	}
	expect := ea.loadTime
	if expect <= 0 {
		expect = DefaultAdapterLoadTime
	}
	if _, ok := ea.loaded[name]; ok {
		return 0
	}
	if l, ok := ea.loading[name]; ok {
		return max(expect-time.Since(l.start), 0)
	}
	if len(ea.loaded)+len(ea.loading) >= slots && ea.evictable() == "" {
		return adapterLoadTimeout
	}
	return expect
}

// loaded ends the load of name on engine id, recording it and the time it
// took when ok (the loading request's use counted), and wakes the requests
// waiting for it.
func (a *adapterLoads) loaded(id, name string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ea := a.engines[id]
	l := ea.loading[name]
	close(l.done)
	delete(ea.loading, name)
	if !ok {
		return
	}
	ea.loaded[name] = &loadedAdapter{lastUsed: time.Now()}
	took := time.Since(l.start)
	if ea.loadTime <= 0 {
		ea.loadTime = took
	} else {
		ea.loadTime = time.Duration(loadTimeDecay*float64(ea.loadTime) + (1-loadTimeDecay)*float64(took))
	}
}

// release ends one use of name on engine id; gone forgets that it is
// loaded there.
func (a *adapterLoads) release(id, name string, gone bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ea := a.engines[id]
	if ea == nil {
		return
	}
	l := ea.loaded[name]
	if l == nil {
		return
	}
	if l.inUse > 0 {
		l.inUse--
	}
	if gone {
		delete(ea.loaded, name)
	}
}

func (a *adapterLoads) size() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.engines)
}

// forget drops what the router knows of engines no longer in the pool.
func (a *adapterLoads) forget(live map[string]bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, ea := range a.engines {
		if !live[id] && len(ea.loading) == 0 {
			delete(a.engines, id)
		}
	}
}

// loadAdapter unloads evict (when set; an adapter already gone is fine)
// and loads name from path on wk. An engine that already has name (another
// router loaded it) counts as loaded.
func (g *Gateway) loadAdapter(ctx context.Context, wk *scoring.Worker, name, path, evict string) error {
	ctx, cancel := context.WithTimeout(ctx, adapterLoadTimeout)
	defer cancel()
	if evict != "" {
		if _, _, err := g.adapterCall(ctx, wk, "/v1/unload_lora_adapter", map[string]string{"lora_name": evict}); err != nil {
			g.log.Warn("unloading LoRA adapter failed", "worker", wk.ID, "adapter", evict, "error", err)
		}
	}
	status, body, err := g.adapterCall(ctx, wk, "/v1/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": path})
	switch {
	case err != nil:
		return err
	case status == http.StatusOK:
		return nil
	case status == http.StatusBadRequest && strings.Contains(string(body), "already been loaded"):
		return nil
	}
	return errors.New("loading LoRA adapter " + name + ": engine answered " + http.StatusText(status) + ": " +
		asAPIError(status, body).Message)
}

// adapterCall POSTs v as JSON to path on wk and returns the status and at
// most maxEngineErrorBody bytes of the answer.
func (g *Gateway) adapterCall(ctx context.Context, wk *scoring.Worker, path string, v any) (int, []byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+wk.Address+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header["Accept-Encoding"] = identityEncoding
	resp, err := g.cfg.Transport.RoundTrip(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxEngineErrorBody))
	return resp.StatusCode, body, err
}
