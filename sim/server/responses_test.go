package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

type responseJSON struct {
	ID     string  `json:"id"`
	Object string  `json:"object"`
	Status string  `json:"status"`
	Prev   *string `json:"previous_response_id"`
	Output []struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// TestResponsesStore: a response's id is its request_id; stored, GET finds it
// and previous_response_id continues its conversation (a longer prompt); an
// unknown id is 404 and cancel of a finished response is 400, as vLLM answers.
func TestResponsesStore(t *testing.T) {
	_, url := startServer(t, nil)
	code, b := post(t, url+"/v1/responses", `{"model":"m","input":"hello there","max_output_tokens":5,"request_id":"resp_one"}`)
	must.Eq(t, http.StatusOK, code, must.Sprint(string(b)))
	first := decode[responseJSON](t, b)
	must.Eq(t, "resp_one", first.ID)
	must.Eq(t, "response", first.Object)
	must.Eq(t, "output_text", first.Output[0].Content[0].Type)
	must.Positive(t, first.Usage.OutputTokens)

	resp, err := http.Get(url + "/v1/responses/resp_one")
	must.NoError(t, err)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()

	code, b = post(t, url+"/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"and?"}]}],"previous_response_id":"resp_one","max_output_tokens":3}`)
	must.Eq(t, http.StatusOK, code, must.Sprint(string(b)))
	second := decode[responseJSON](t, b)
	must.StrHasPrefix(t, "resp_", second.ID)
	must.Eq(t, "resp_one", *second.Prev)
	must.Greater(t, first.Usage.InputTokens+first.Usage.OutputTokens, second.Usage.InputTokens)

	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{http.MethodGet, "/v1/responses/resp_nope", "", http.StatusNotFound},
		{http.MethodPost, "/v1/responses/resp_nope/cancel", "", http.StatusNotFound},
		{http.MethodPost, "/v1/responses/resp_one/cancel", "", http.StatusBadRequest},
		{http.MethodPost, "/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_nope"}`, http.StatusNotFound},
		{http.MethodPost, "/v1/responses", `{"model":"m","input":"x","store":false,"request_id":"resp_two"}`, http.StatusOK},
		{http.MethodGet, "/v1/responses/resp_two", "", http.StatusNotFound},
		{http.MethodPost, "/v1/responses", `{"model":"m","input":7}`, http.StatusBadRequest},
	} {
		req, err := http.NewRequest(tc.method, url+tc.path, strings.NewReader(tc.body))
		must.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		must.NoError(t, err)
		resp.Body.Close()
		must.Eq(t, tc.want, resp.StatusCode, must.Sprint(tc))
	}
}

// TestResponsesStream: the event stream starts with response.created and
// ends with response.completed, whose text is the deltas joined.
func TestResponsesStream(t *testing.T) {
	_, url := startServer(t, nil)
	code, b := post(t, url+"/v1/responses", `{"model":"m","input":"stream me","stream":true,"max_output_tokens":6}`)
	must.Eq(t, http.StatusOK, code)
	events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	must.StrHasPrefix(t, "event: response.created\n", events[0])
	last := events[len(events)-1]
	must.StrHasPrefix(t, "event: response.completed\n", last)
	var deltas strings.Builder
	for _, e := range events {
		if strings.HasPrefix(e, "event: response.output_text.delta\n") {
			d := decode[struct{ Delta string }](t, []byte(strings.TrimPrefix(e[strings.Index(e, "\n")+1:], "data: ")))
			deltas.WriteString(d.Delta)
		}
	}
	done := decode[struct{ Response responseJSON }](t, []byte(strings.TrimPrefix(last[strings.Index(last, "\n")+1:], "data: ")))
	must.Eq(t, done.Response.Output[0].Content[0].Text, deltas.String())
	must.NotEq(t, "", deltas.String())
}

// TestLoRAAdapters: an adapter is served by name and listed with its base
// model as parent; another name is 404.
func TestLoRAAdapters(t *testing.T) {
	_, url := startServer(t, func(c *Config) { c.LoRAModules = []LoRAModule{{Name: "sql", Path: "/a/sql"}} })
	code, b := post(t, url+"/v1/completions", `{"model":"sql","prompt":"select","max_tokens":2}`)
	must.Eq(t, http.StatusOK, code, must.Sprint(string(b)))
	must.Eq(t, "sql", decode[struct{ Model string }](t, b).Model)
	code, _ = post(t, url+"/v1/completions", `{"model":"nope","prompt":"x"}`)
	must.Eq(t, http.StatusNotFound, code)
	resp, err := http.Get(url + "/v1/models")
	must.NoError(t, err)
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID     string
			Root   string
			Parent *string
		}
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	must.Eq(t, 2, len(list.Data))
	must.Eq(t, "sql", list.Data[1].ID)
	must.Eq(t, "/a/sql", list.Data[1].Root)
	must.Eq(t, "m", *list.Data[1].Parent)
	must.Nil(t, list.Data[0].Parent)
}

// TestRuntimeLoRA: with RuntimeLoRA the sim loads and unloads adapters as
// vLLM does with VLLM_ALLOW_RUNTIME_LORA_UPDATING, with vLLM's answers; a
// loaded adapter is served by name and listed with its base model as parent.
func TestRuntimeLoRA(t *testing.T) {
	_, url := startServer(t, func(c *Config) {
		c.RuntimeLoRA = true
		c.LoRAModules = []LoRAModule{{Name: "static", Path: "/a/static"}}
	})
	for _, tc := range []struct {
		path, body string
		want       int
	}{
		{"/v1/completions", `{"model":"dyn","prompt":"x","max_tokens":1}`, http.StatusNotFound},
		{"/v1/load_lora_adapter", `{"lora_name":"dyn"}`, http.StatusBadRequest},
		{"/v1/load_lora_adapter", `{"lora_name":"dyn","lora_path":"/a/dyn"}`, http.StatusOK},
		{"/v1/load_lora_adapter", `{"lora_name":"dyn","lora_path":"/a/dyn"}`, http.StatusBadRequest},
		{"/v1/load_lora_adapter", `{"lora_name":"static","lora_path":"/a/x"}`, http.StatusBadRequest},
		{"/v1/completions", `{"model":"dyn","prompt":"x","max_tokens":1}`, http.StatusOK},
		{"/v1/unload_lora_adapter", `{"lora_name":"dyn"}`, http.StatusOK},
		{"/v1/unload_lora_adapter", `{"lora_name":"dyn"}`, http.StatusNotFound},
		{"/v1/completions", `{"model":"dyn","prompt":"x","max_tokens":1}`, http.StatusNotFound},
	} {
		code, b := post(t, url+tc.path, tc.body)
		must.Eq(t, tc.want, code, must.Sprint(tc, string(b)))
	}
	code, _ := post(t, url+"/v1/load_lora_adapter", `{"lora_name":"dyn","lora_path":"/a/dyn"}`)
	must.Eq(t, http.StatusOK, code)
	resp, err := http.Get(url + "/v1/models")
	must.NoError(t, err)
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID, Root string
			Parent   *string
		}
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	must.Eq(t, 3, len(list.Data))
	must.Eq(t, "dyn", list.Data[2].ID)
	must.Eq(t, "/a/dyn", list.Data[2].Root)
	must.Eq(t, "m", *list.Data[2].Parent)

	// Without it the endpoints do not exist, as in vLLM.
	_, url2 := startServer(t, nil)
	code, _ = post(t, url2+"/v1/load_lora_adapter", `{"lora_name":"dyn","lora_path":"/a/dyn"}`)
	must.Eq(t, http.StatusNotFound, code)
}
