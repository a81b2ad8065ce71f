package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/discovery"
)

// TestServedNamesAndAdapters: an engine serving further names and LoRA
// adapters is routable by each (only engines serving the name get it), and
// /v1/models lists them, adapters with their base model as parent and the
// root the engine reports.
func TestServedNamesAndAdapters(t *testing.T) {
	var hitsA, hitsB atomic.Int64
	a := echoEngine(t, "a", &hitsA)
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m3","root":"/models/m3","created":7,"max_model_len":4096},`+
				`{"id":"sql-lora","root":"/adapters/sql","parent":"m3","created":7,"max_model_len":4096}]}`)
			return
		}
		hitsB.Add(1)
		fmt.Fprint(w, `{"engine":"b"}`)
	}))
	t.Cleanup(b.Close)
	h := newHarnessWith(t, Config{}, nil, nil)
	h.pool.Set([]discovery.Instance{
		{ID: "a", Address: addr(a), Meta: map[string]string{discovery.MetaModel: "m3", discovery.MetaServedNames: "m3-alias"}},
		{ID: "b", Address: addr(b), Meta: map[string]string{discovery.MetaModel: "m3", discovery.MetaLoRAAdapters: "sql-lora"}},
	})

	for i := 0; i < 4; i++ {
		resp := h.post("/v1/completions", `{"model":"sql-lora","prompt":"select"}`)
		must.Eq(t, http.StatusOK, resp.StatusCode)
		resp.Body.Close()
		resp = h.post("/v1/completions", `{"model":"m3-alias","prompt":"hi"}`)
		must.Eq(t, http.StatusOK, resp.StatusCode)
		resp.Body.Close()
	}
	must.Eq(t, int64(4), hitsB.Load()) // only b serves the adapter
	must.Eq(t, int64(4), hitsA.Load()) // only a serves the alias

	resp := h.do(http.MethodGet, "/v1/models")
	must.Eq(t, http.StatusOK, resp.StatusCode)
	var list struct{ Data []modelCard }
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	resp.Body.Close()
	ids := map[string]modelCard{}
	for _, c := range list.Data {
		ids[c.ID] = c
	}
	must.MapLen(t, 3, ids)
	must.Nil(t, ids["m3-alias"].Parent)
	must.Eq(t, "m3", *ids["sql-lora"].Parent)
	must.Eq(t, "/adapters/sql", ids["sql-lora"].Root)
	must.Eq(t, int64(7), ids["sql-lora"].Created)

	resp = h.post("/v1/completions", `{"model":"other-lora","prompt":"x"}`)
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	must.Eq(t, "model_not_found", *readErr(t, resp).Error.Code)
}

// loraEngine serves its base model and the adapters loaded into it at run
// time, as vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING does.
type loraEngine struct {
	*httptest.Server
	mu       sync.Mutex
	loaded   map[string]bool
	calls    []string // "load x", "unload x"
	failLoad bool
}

func newLoRAEngine(t *testing.T, failLoad bool) *loraEngine {
	e := &loraEngine{loaded: map[string]bool{}, failLoad: failLoad}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/load_lora_adapter", func(w http.ResponseWriter, r *http.Request) {
		var v struct{ LoraName, LoraPath string }
		_ = json.NewDecoder(r.Body).Decode(&struct {
			N *string `json:"lora_name"`
			P *string `json:"lora_path"`
		}{&v.LoraName, &v.LoraPath})
		time.Sleep(20 * time.Millisecond) // a load takes a while: concurrent requests must share it
		e.mu.Lock()
		defer e.mu.Unlock()
		e.calls = append(e.calls, "load "+v.LoraName+"="+v.LoraPath)
		switch {
		case e.failLoad:
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":{"message":"no such adapter directory","type":"InternalServerError","code":500}}`)
		case e.loaded[v.LoraName]:
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":{"message":"The lora adapter '%s' has already been loaded.","code":400}}`, v.LoraName)
		default:
			e.loaded[v.LoraName] = true
		}
	})
	mux.HandleFunc("POST /v1/unload_lora_adapter", func(w http.ResponseWriter, r *http.Request) {
		var v struct {
			N string `json:"lora_name"`
		}
		_ = json.NewDecoder(r.Body).Decode(&v)
		e.mu.Lock()
		defer e.mu.Unlock()
		e.calls = append(e.calls, "unload "+v.N)
		delete(e.loaded, v.N)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var v struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&v)
		e.mu.Lock()
		ok := v.Model == "m3" || e.loaded[v.Model]
		e.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"The model %s does not exist.","code":404}}`, v.Model)
			return
		}
		fmt.Fprintf(w, `{"model":%q}`, v.Model)
	})
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	return e
}

func (e *loraEngine) history() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

// TestAdaptersLoadedOnDemand: an adapter an engine lists as loadable is
// loaded there before the first request naming it, once however many
// requests arrive together; past Config.MaxLoadedAdapters the least
// recently used one is unloaded first; an engine that cannot load it fails
// the attempt, and the request is retried on another.
func TestAdaptersLoadedOnDemand(t *testing.T) {
	e := newLoRAEngine(t, false)
	h := newHarnessWith(t, Config{MaxLoadedAdapters: 2}, nil, nil)
	loadable := "l1=/a/l1,l2=/a/l2,l3=/a/l3"
	h.pool.Set([]discovery.Instance{{ID: "a", Address: addr(e.Server),
		Meta: map[string]string{discovery.MetaModel: "m3", discovery.MetaLoRALoadable: loadable}}})

	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post("/v1/completions", `{"model":"l1","prompt":"x"}`)
			resp.Body.Close()
			must.Eq(t, http.StatusOK, resp.StatusCode)
		}()
	}
	wg.Wait()
	for _, m := range []string{"l2", "l1", "l3", "l3"} {
		resp := h.post("/v1/completions", `{"model":"`+m+`","prompt":"x"}`)
		resp.Body.Close()
		must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(m))
	}
	// l2 was the least recently used when l3 needed a slot.
	must.Eq(t, []string{"load l1=/a/l1", "load l2=/a/l2", "unload l2", "load l3=/a/l3"}, e.history())

	// The engine restarts under the same instance id: its adapters are gone.
	// The request that finds out gets the engine's 404; the next loads again.
	e.mu.Lock()
	clear(e.loaded)
	e.mu.Unlock()
	resp := h.post("/v1/completions", `{"model":"l3","prompt":"x"}`)
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	resp.Body.Close()
	resp = h.post("/v1/completions", `{"model":"l3","prompt":"x"}`)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	must.Eq(t, "load l3=/a/l3", e.history()[len(e.history())-1])

	bad, good := newLoRAEngine(t, true), newLoRAEngine(t, false)
	h2 := newHarnessWith(t, Config{}, nil, nil)
	h2.pool.Set([]discovery.Instance{
		{ID: "bad", Address: addr(bad.Server), Meta: map[string]string{discovery.MetaModel: "m3", discovery.MetaLoRALoadable: loadable}},
		{ID: "good", Address: addr(good.Server), Meta: map[string]string{discovery.MetaModel: "m3", discovery.MetaLoRALoadable: loadable}},
	})
	for range 4 {
		resp := h2.post("/v1/completions", `{"model":"l1","prompt":"x"}`)
		resp.Body.Close()
		must.Eq(t, http.StatusOK, resp.StatusCode)
	}
	must.Eq(t, []string{"load l1=/a/l1"}, good.history())
	must.SliceNotEmpty(t, bad.history())
}

// TestAdapterLoadTime: what the routing score is told an engine needs
// before it can serve an adapter: nothing where it is loaded, the default
// or the engine's measured load time where it is not, what is left of a
// load under way, and the load timeout where every slot is in use.
func TestAdapterLoadTime(t *testing.T) {
	var a adapterLoads
	must.Eq(t, DefaultAdapterLoadTime, a.loadTimeOn("e", "l1", 2))

	_, _, _ = a.claim("e", "l1", 2)
	a.engines["e"].loading["l1"].start = time.Now().Add(-300 * time.Millisecond)
	left := a.loadTimeOn("e", "l1", 2)
	must.Between(t, 0, left, DefaultAdapterLoadTime-300*time.Millisecond)
	a.loaded("e", "l1", true) // took about 300ms: the engine's load time
	took := a.engines["e"].loadTime
	must.Between(t, 300*time.Millisecond, took, DefaultAdapterLoadTime)

	cases := []struct {
		name, adapter string
		want          time.Duration
	}{
		{"loaded", "l1", 0},
		{"measured on the engine", "l2", took},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, a.loadTimeOn("e", tc.adapter, 2))
		})
	}

	// Two slots: l1 loaded and in use, l2 loading.
	_, _, _ = a.claim("e", "l1", 2)
	_, _, _ = a.claim("e", "l2", 2)
	must.Eq(t, adapterLoadTimeout, a.loadTimeOn("e", "l3", 2), must.Sprint("no slot to free"))
	a.release("e", "l1", false)
	must.Eq(t, took, a.loadTimeOn("e", "l3", 2), must.Sprint("l1 unused: its slot can be freed"))
	a.loaded("e", "l2", false)
	must.Eq(t, took, a.loadTimeOn("e", "l2", 2), must.Sprint("a failed load measures nothing"))
}

// TestLlamaServerAdapters: on a llama-server an adapter of
// oasis_lora_loadable is applied per request: the router finds its id in
// GET /lora-adapters once and appends "lora" to every body naming it;
// base-model bodies get "lora": [] (no adapter), unless they carry their
// own; an adapter the engine does not list fails the attempt.
func TestLlamaServerAdapters(t *testing.T) {
	var lists atomic.Int64
	var mu sync.Mutex
	var bodies []string
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/lora-adapters" {
			lists.Add(1)
			fmt.Fprint(w, `[{"id":0,"path":"/a/chat.gguf","scale":0.0,"task_name":"","prompt_prefix":""},`+
				`{"id":1,"path":"/a/sql.gguf","scale":0.0}]`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		fmt.Fprint(w, `{"object":"chat.completion"}`)
	}))
	t.Cleanup(e.Close)
	h := newHarnessWith(t, Config{}, nil, nil)
	h.pool.Set([]discovery.Instance{{ID: "l", Address: addr(e), Meta: map[string]string{discovery.MetaModel: "tiny",
		discovery.MetaEngine: "llama_cpp", discovery.MetaLoRALoadable: "sql=/a/sql.gguf,gone=/a/gone.gguf"}}})

	cases := []struct {
		model  string
		status int
		body   string // what the engine got; "" for nothing
	}{
		{"sql", http.StatusOK, `{"model":"sql","messages":[]` + `,"lora":[{"id":1,"scale":1}]}`},
		{"sql", http.StatusOK, `{"model":"sql","messages":[]` + `,"lora":[{"id":1,"scale":1}]}`},
		{"tiny", http.StatusOK, `{"model":"tiny","messages":[],"lora":[{"id":0,"scale":0}]}`},
		{"gone", http.StatusBadGateway, ""},
		{"own", http.StatusOK, `{"model":"tiny","messages":[],"lora":[{"id":0,"scale":0.5}]}`},
	}
	for _, tc := range cases {
		mu.Lock()
		bodies = nil
		mu.Unlock()
		req := `{"model":"` + tc.model + `","messages":[]}`
		if tc.model == "own" {
			req = `{"model":"tiny","messages":[],"lora":[{"id":0,"scale":0.5}]}`
		}
		resp := h.post("/v1/chat/completions", req)
		resp.Body.Close()
		must.Eq(t, tc.status, resp.StatusCode, must.Sprint(tc.model))
		mu.Lock()
		got := slices.Clone(bodies)
		mu.Unlock()
		if tc.body == "" {
			must.SliceEmpty(t, got)
		} else {
			must.Eq(t, []string{tc.body}, got)
		}
	}
	must.Eq(t, int64(2), lists.Load(), must.Sprint("asked once for sql (cached), once for gone (not found: not cached)"))
}
