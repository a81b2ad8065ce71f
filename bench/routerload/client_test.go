package main

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/router/openai"
)

// sseServer answers every request as an engine streams: a role-only chunk at
// once, a token tokenDelay later, another and [DONE]; it remembers the
// protocol of the last request.
const tokenDelay = 5 * time.Millisecond

func sseServer(proto *atomic.Value) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto.Store(r.Proto)
		if r.URL.Path != "/v1/chat/completions" || r.Method != http.MethodPost {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i, ev := range []string{`{"choices":[{"delta":{"role":"assistant","content":""}}]}`,
			`{"choices":[{"delta":{"content":"hi"}}]}`, `{"choices":[{"delta":{"content":"!"}}]}`, "[DONE]"} {
			if i == 1 {
				time.Sleep(tokenDelay) // the input: the fake engine's time between tokens
			}
			fmt.Fprintf(w, "data: %s\n\n", ev)
			w.(http.Flusher).Flush()
		}
	})
}

// writeCA writes the test server's certificate (self-signed, a CA) as PEM.
func writeCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHTTPSClient(t *testing.T) {
	for _, tc := range []struct {
		name      string
		h2        bool
		wantProto string // server side
		wantKind  string // client side, prefix of connStats.protocol
	}{
		{"HTTP/1.1 by default", false, "HTTP/1.1", "HTTP/1.1 over TLS 1.3 ("},
		{"HTTP/2 with -h2", true, "HTTP/2.0", "HTTP/2 over TLS 1.3 ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var proto atomic.Value
			srv := httptest.NewUnstartedServer(sseServer(&proto))
			srv.EnableHTTP2 = true // the server offers both; the client chooses
			srv.StartTLS()
			defer srv.Close()

			cfg, err := clientTLS(writeCA(t, srv), tc.h2)
			if err != nil {
				t.Fatal(err)
			}
			st := newConnStats()
			c := newClient(cfg, tc.h2, st)
			body := `{"model":"m","messages":[],"stream":true}`
			for i := range 2 {
				tm, err := stream(c, srv.URL, body)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				// The server waits tokenDelay before the first token: it cannot
				// arrive sooner, nor before the role-only first event. (The gap
				// between the two events can look shorter than tokenDelay: the
				// first event may reach the client late.)
				if tm.ttfe <= 0 || tm.ttft < tokenDelay || tm.ttft < tm.ttfe || tm.total < tm.ttft {
					t.Fatalf("request %d: %+v", i, tm)
				}
			}
			if got := proto.Load(); got != tc.wantProto {
				t.Errorf("server saw %v, want %s", got, tc.wantProto)
			}
			if got := st.protocol(); !strings.HasPrefix(got, tc.wantKind) {
				t.Errorf("protocol %q, want prefix %q", got, tc.wantKind)
			}
			if got := st.counts(); got != (connCounts{opened: 1, tls: 1}) {
				t.Errorf("after two requests on a kept-alive connection: %+v, want one full handshake", got)
			}

			// A new connection resumes the session from the first.
			before := snapshot([]target{{name: "x", conns: st}})
			c.CloseIdleConnections()
			if _, err := stream(c, srv.URL, body); err != nil {
				t.Fatal(err)
			}
			if got := st.counts(); got != (connCounts{opened: 2, tls: 2, resumed: 1}) {
				t.Errorf("after a reconnect: %+v, want the second handshake resumed", got)
			}
			if got, want := connLine([]target{{name: "x", conns: st}}, before), "connections opened: x 1 (TLS: 0 full, 1 resumed)"; got != want {
				t.Errorf("connLine = %q, want %q", got, want)
			}
		})
	}
}

func TestHTTPSClientChecksTheCA(t *testing.T) {
	var proto atomic.Value
	srv := httptest.NewTLSServer(sseServer(&proto))
	defer srv.Close()

	// Without -ca the system's roots do not know httptest's CA.
	cfg, err := clientTLS("", false)
	if err != nil {
		t.Fatal(err)
	}
	st := newConnStats()
	if _, err := stream(newClient(cfg, false, st), srv.URL, "{}"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: err %v, want a certificate error", err)
	}
	if st.counts().opened != 0 {
		t.Errorf("a failed handshake counted as a connection: %+v", st.counts())
	}

	bad := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := clientTLS(bad, false); err == nil {
		t.Fatal("-ca with no PEM certificate accepted")
	}
	if _, err := clientTLS(filepath.Join(t.TempDir(), "missing.pem"), false); err == nil {
		t.Fatal("-ca with a missing file accepted")
	}
}

func TestPlainClient(t *testing.T) {
	var proto atomic.Value
	srv := httptest.NewServer(sseServer(&proto))
	defer srv.Close()
	cfg, err := clientTLS("", true) // -h2 does not apply to http:// targets
	if err != nil {
		t.Fatal(err)
	}
	st := newConnStats()
	if _, err := stream(newClient(cfg, true, st), srv.URL, "{}"); err != nil {
		t.Fatal(err)
	}
	if got := st.protocol(); got != "HTTP/1.1 (plain)" {
		t.Errorf("protocol %q", got)
	}
	if got := proto.Load(); got != "HTTP/1.1" {
		t.Errorf("server saw %v", got)
	}
	if got := connLine([]target{{name: "direct", conns: st}}, map[string]connCounts{}); got != "connections opened: direct 1" {
		t.Errorf("connLine = %q", got)
	}
}

func TestCarriesToken(t *testing.T) {
	for _, tc := range []struct {
		data string
		want bool
	}{
		{` {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, false},
		{`{"choices":[{"delta":{"role":"assistant"}}]}`, false},
		{`{"choices":[{"text":""}]}`, false},
		{`{"choices":[{"delta":{"content":"Hello"}}]}`, true},
		{`{"choices":[{"text":"Hello"}]}`, true},
		{`{"choices":[{"delta":{},"finish_reason":"length"}]}`, true},
		{`{"choices":[{"delta":{"tool_calls":[{"id":"x"}]}}]}`, true},
		{`{"error":{"message":"boom"}}`, true},
		{`{"choices":[],"usage":{"prompt_tokens":3}}`, true},
		{` [DONE]`, true},
		{`not json`, true},
	} {
		if got := !openai.IsPreamble([]byte(tc.data)); got != tc.want {
			t.Errorf("!IsPreamble(%s) = %v, want %v", tc.data, got, tc.want)
		}
	}
}
