package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

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
