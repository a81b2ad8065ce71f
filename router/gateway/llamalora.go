package gateway

// LoRA adapters on llama-server (oasis_engine=llama_cpp). llama-server
// loads its adapters at start (--lora PATH, ids 0, 1, ... in that order;
// GET /lora-adapters lists id and path) and applies them per request: a
// body's "lora": [{"id": N, "scale": S}] applies those and no other
// (tools/server/README.md). An adapter the engine lists in
// oasis_lora_loadable (name=PATH, PATH as given to --lora) is routable by
// its name: before the first attempt on the engine naming it the router
// finds its id in GET /lora-adapters (once per instance id and name), and
// every attempt there carries "lora": [{"id": N, "scale": 1}] appended to
// the body (the last member wins). A body naming the base model, on such an
// engine, without a "lora" member of its own gets "lora": [{"id": 0,
// "scale": 0}] (the base model alone): llama-server applies every adapter
// not listed at scale 0 only when the list is not empty; an empty list or
// none applies its adapters at the global scales (1 from --lora, or what
// POST /lora-adapters set). Nothing is loaded or unloaded, so the routing
// score prices no load on such an engine.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// maxLlamaAdapters bounds the entries of GET /lora-adapters read.
const maxLlamaAdapters = 1024

// llamaAdapter is one entry of llama-server's GET /lora-adapters.
type llamaAdapter struct {
	ID   int    `json:"id"`
	Path string `json:"path"`
}

// llamaLoRAID returns the id llama-server wk gives the adapter at path,
// asking GET /lora-adapters the first time (cached by instance id and
// name). An engine without the adapter fails the attempt.
func (g *Gateway) llamaLoRAID(ctx context.Context, wk *scoring.Worker, name, path string) (int, error) {
	if id, ok := g.adapters.llamaID(wk.ID, name); ok {
		return id, nil
	}
	ctx, cancel := context.WithTimeout(ctx, modelsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+wk.Address+"/lora-adapters", nil)
	if err != nil {
		return 0, err
	}
	req.Header["Accept-Encoding"] = identityEncoding
	resp, err := g.cfg.Transport.RoundTrip(req)
	if err != nil {
		return 0, &upstreamError{err: err}
	}
	defer resp.Body.Close()
	var list []llamaAdapter
	if resp.StatusCode != http.StatusOK {
		return 0, &upstreamError{err: fmt.Errorf("GET /lora-adapters: engine answered %s", resp.Status)}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return 0, &upstreamError{err: fmt.Errorf("GET /lora-adapters: %w", err)}
	}
	for _, a := range list[:min(len(list), maxLlamaAdapters)] {
		if a.Path == path && a.ID >= 0 {
			g.adapters.setLlamaID(wk.ID, name, a.ID)
			return a.ID, nil
		}
	}
	return 0, &upstreamError{err: fmt.Errorf("llama-server lists no LoRA adapter at %q (adapter %s)", path, name)}
}

// llamaBaseOnly is the body member applying no adapter: a non-empty list
// (llama-server's construct_lora_list sets every adapter it does not name
// to 0) naming adapter 0, which an engine with adapters has, at scale 0.
var llamaBaseOnly = json.RawMessage(`[{"id":0,"scale":0}]`)

// llamaLoRAMember is the body member applying adapter id alone.
func llamaLoRAMember(id int) json.RawMessage {
	return json.RawMessage(`[{"id":` + strconv.Itoa(id) + `,"scale":1}]`)
}

// withLlamaLoRA appends the adapter x names to body when wk is a
// llama-server that serves it (its id found by useAdapter), and
// llamaBaseOnly to a body naming wk's base model when wk has adapters and
// the client sent no "lora" of its own.
func (g *Gateway) withLlamaLoRA(body []byte, x *exchange, wk *scoring.Worker) []byte {
	if wk.Engine != engineLlamaCpp || wk.Upstream != "" || x.remote != nil || len(wk.Loadable) == 0 {
		return body
	}
	if id, ok := g.adapters.llamaID(wk.ID, x.req.Model); ok {
		return openai.AppendMember(body, "lora", llamaLoRAMember(id))
	}
	if _, adapter := wk.LoadablePath(x.req.Model); !adapter && !bytes.Contains(x.body, []byte(`"lora"`)) {
		return openai.AppendMember(body, "lora", llamaBaseOnly)
	}
	return body
}

// llamaID returns the llama-server adapter id of name on engine id.
func (a *adapterLoads) llamaID(id, name string) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ea := a.engines[id]
	if ea == nil {
		return 0, false
	}
	n, ok := ea.llama[name]
	return n, ok
}

func (a *adapterLoads) setLlamaID(id, name string, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ea := a.engine(id)
	if ea.llama == nil {
		ea.llama = map[string]int{}
	}
	ea.llama[name] = n
}
