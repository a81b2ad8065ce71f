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
	loading map[string]chan struct{} // closed when the load ends
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

// errAdapterSlotsName marks a claim that found no slot.
const errAdapterSlotsName = "\x00full"

// claim counts one use of name on engine id when it is loaded (ea nil);
// returns a channel to wait on while another request loads it; else
// reserves the load for the caller (ea set), naming the adapter to unload
// first ("" for none, errAdapterSlotsName when no slot can be freed).
func (a *adapterLoads) claim(id, name string, max int) (ea *engineAdapters, wait <-chan struct{}, evict string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.engines == nil {
		a.engines = map[string]*engineAdapters{}
	}
	ea = a.engines[id]
	if ea == nil {
		ea = &engineAdapters{loaded: map[string]*loadedAdapter{}, loading: map[string]chan struct{}{}}
		a.engines[id] = ea
	}
	if l, ok := ea.loaded[name]; ok {
		l.inUse++
		l.lastUsed = time.Now()
		return nil, nil, ""
	}
	if ch, ok := ea.loading[name]; ok {
		return nil, ch, ""
	}
	if len(ea.loaded)+len(ea.loading) >= max {
		var oldest time.Time
		for n, l := range ea.loaded {
			if l.inUse == 0 && (evict == "" || l.lastUsed.Before(oldest)) {
				evict, oldest = n, l.lastUsed
			}
		}
		if evict == "" {
			return ea, nil, errAdapterSlotsName
		}
		delete(ea.loaded, evict)
	}
	ea.loading[name] = make(chan struct{})
	return ea, nil, evict
}

// loaded ends the load of name on engine id, recording it when ok (the
// loading request's use counted), and wakes the requests waiting for it.
func (a *adapterLoads) loaded(id, name string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ea := a.engines[id]
	close(ea.loading[name])
	delete(ea.loading, name)
	if ok {
		ea.loaded[name] = &loadedAdapter{lastUsed: time.Now()}
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
