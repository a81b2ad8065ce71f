package openai

import "testing"

func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly and precisely."},{"role":"user","content":"Explain how a reverse proxy streams server-sent events without buffering them, in three sentences."}],"max_tokens":128,"temperature":0.7,"stream":true,"stream_options":{"include_usage":true}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRequest("/v1/chat/completions", body); err != nil {
			b.Fatal(err)
		}
	}
}
