package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkProxyStreaming measures the router's per-request cost for a short
// streaming completion against an in-process engine (engine cost included;
// compare with BenchmarkDirectStreaming for the router's share).
func BenchmarkProxyStreaming(b *testing.B) {
	e := sseEngine()
	defer e.Close()
	h := newHarnessWith(b, Config{}, nil, map[string]string{"a": "m@" + addr(e)})
	benchStream(b, h.srv.URL)
}

// BenchmarkProxyStreamingTraced is BenchmarkProxyStreaming with tracing on,
// every request sampled, spans batched and exported over OTLP/HTTP to an
// in-process receiver that discards them: the tracing's whole cost on the
// router's machine.
func BenchmarkProxyStreamingTraced(b *testing.B) {
	e := sseEngine()
	defer e.Close()
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(sink.URL+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	h := newHarnessWith(b, Config{TracerProvider: tp}, nil, map[string]string{"a": "m@" + addr(e)})
	benchStream(b, h.srv.URL)
}

func BenchmarkDirectStreaming(b *testing.B) {
	e := sseEngine()
	defer e.Close()
	benchStream(b, e.URL)
}

func sseEngine() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 4 {
			fmt.Fprintf(w, "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
}

func benchStream(b *testing.B, url string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":4,"stream":true}`
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
