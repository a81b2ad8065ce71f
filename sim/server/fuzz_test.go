package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/sim/engine"
)

// FuzzAPI feeds arbitrary bodies to every POST endpoint: each answers with a status,
// never a panic, and a 200 generation always completes.
func FuzzAPI(f *testing.F) {
	for _, seed := range []string{
		`{"prompt":"hi","max_tokens":3}`,
		`{"prompt":[1,2,3],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"logprobs":true,"top_logprobs":2,"max_tokens":2}`,
		`{"prompt":"x","stop":["a","b"],"max_tokens":5,"logprobs":3,"echo":true}`,
		`{"tokens":[1,2,16843012]}`,
		`{"prompt":["one"],"seed":-5,"temperature":0}`,
		`{"messages":[{"role":"user","content":null}],"max_completion_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`,
	} {
		f.Add(seed)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	s, err := New(Config{Model: "m", MaxModelLen: 512, Engine: engine.Config{BlockSize: 16, NumGPUBlocks: 64}})
	if err != nil {
		f.Fatal(err)
	}
	go s.Run(ctx)
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"} {
			rec := httptest.NewRecorder()
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)).WithContext(rctx))
			expired := rctx.Err() != nil
			rcancel()
			if expired {
				t.Fatalf("%s: no answer within 5s for %q", path, body)
			}
			if rec.Code != 200 && rec.Code != 400 && rec.Code != 404 {
				t.Fatalf("%s: status %d for %q: %s", path, rec.Code, body, rec.Body.String())
			}
		}
	})
}
