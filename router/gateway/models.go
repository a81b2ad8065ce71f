package gateway

// /v1/models in vLLM's shape (issue #36): the same list from every router
// replica (models sorted, no per-process timestamps), each model's created
// and max_model_len as its engine first by instance id reports them, and
// cascade aliases listed.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/scoring"
)

// modelCard is one model of /v1/models, as vLLM lists it.
type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int64            `json:"max_model_len"`
	Permission  []json.RawMessage `json:"permission"`
}

// engineCards caches what engines reported of their model, by instance id;
// an engine's answer does not change while it runs.
type engineCards struct {
	mu sync.Mutex
	m  map[string]modelCard
}

// modelsTimeout bounds the time /v1/models waits for an engine's list.
const modelsTimeout = 2 * time.Second

// models serves GET /v1/models.
func (g *Gateway) models(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{Object: "list", Data: allowedCards(r, g.modelCards(r.Context()))}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// model serves GET /v1/models/{id}.
func (g *Gateway) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, c := range allowedCards(r, g.modelCards(r.Context())) {
		if c.ID == id {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(c)
			return
		}
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
		"The model "+strconv.Quote(id)+" does not exist or no engine serves it", 0)
}

// allowedCards keeps the cards of the models the request's key may use
// (auth.KeySpec.Models): a key sees only what it can call.
func allowedCards(r *http.Request, cards []modelCard) []modelCard {
	k, ok := r.Context().Value(ctxKey{}).(*auth.Key)
	if !ok {
		return cards
	}
	return slices.DeleteFunc(cards, func(c modelCard) bool { return !k.Allows(c.ID) })
}

// modelCards lists the pool's models, then the cascade aliases, sorted.
func (g *Gateway) modelCards(ctx context.Context) []modelCard {
	models := g.cfg.Pool.Models()
	cards := make([]modelCard, len(models))
	var wg sync.WaitGroup
	for i, m := range models {
		cards[i] = modelCard{ID: m, Object: "model", OwnedBy: "oasis", Root: m, Permission: []json.RawMessage{}}
		if wk := firstEngine(g.cfg.Pool.Workers(m)); wk != nil {
			if wk.Adapter(m) != "" {
				cards[i].Parent = &wk.Model // a LoRA adapter's base model, as vLLM lists it
			}
			wg.Add(1)
			go func() { defer wg.Done(); g.engineCard(ctx, wk, &cards[i]) }()
		}
	}
	wg.Wait()
	doc := g.cfg.Policy.Current()
	aliases := make([]string, 0, len(doc.Cascades))
	for a := range doc.Cascades {
		aliases = append(aliases, a)
	}
	sort.Strings(aliases)
	for _, a := range aliases {
		cards = append(cards, modelCard{ID: a, Object: "model", OwnedBy: "oasis", Root: doc.Cascades[a].Large,
			Permission: []json.RawMessage{}})
	}
	return cards
}

// firstEngine is the local engine first by instance id, nil when none.
func firstEngine(ws []*scoring.Worker) *scoring.Worker {
	var first *scoring.Worker
	for _, wk := range ws {
		if wk.Upstream == "" && (first == nil || wk.ID < first.ID) {
			first = wk
		}
	}
	return first
}

// engineCard fills c's created, owned_by, root, parent and max_model_len
// from what wk's /v1/models reports of c's model (one of the names wk
// serves; cached by instance id and name); c is left as it is when the
// engine does not answer in time.
func (g *Gateway) engineCard(ctx context.Context, wk *scoring.Worker, c *modelCard) {
	key := wk.ID + "\x00" + c.ID
	g.cards.mu.Lock()
	got, ok := g.cards.m[key]
	g.cards.mu.Unlock()
	if !ok {
		if got, ok = g.fetchCard(ctx, wk, c.ID); !ok {
			return
		}
		g.cards.mu.Lock()
		if g.cards.m == nil || len(g.cards.m) > 4*len(g.cfg.Pool.Models())+16 {
			g.cards.m = map[string]modelCard{} // bounded: engines gone are forgotten
		}
		g.cards.m[key] = got
		g.cards.mu.Unlock()
	}
	c.Created, c.MaxModelLen = got.Created, got.MaxModelLen
	if got.Root != "" {
		c.Root = got.Root
	}
	if got.Parent != nil && *got.Parent != "" {
		c.Parent = got.Parent
	}
}

// fetchCard asks wk's /v1/models for the card of name (1 MiB at most).
func (g *Gateway) fetchCard(ctx context.Context, wk *scoring.Worker, name string) (modelCard, bool) {
	ctx, cancel := context.WithTimeout(ctx, modelsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+wk.Address+"/v1/models", nil)
	if err != nil {
		return modelCard{}, false
	}
	req.Header["Accept-Encoding"] = identityEncoding
	resp, err := g.cfg.Transport.RoundTrip(req)
	if err != nil {
		return modelCard{}, false
	}
	defer resp.Body.Close()
	// llama-server reports no max_model_len: its meta.n_ctx (a slot's
	// context) is the longest request it takes.
	var list struct {
		Data []struct {
			modelCard
			Meta struct {
				NCtx *int64 `json:"n_ctx"`
			} `json:"meta"`
		}
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list) != nil {
		return modelCard{}, false
	}
	for _, c := range list.Data {
		if c.ID == name {
			if c.MaxModelLen == nil {
				c.MaxModelLen = c.Meta.NCtx
			}
			return c.modelCard, true
		}
	}
	return modelCard{}, false
}
