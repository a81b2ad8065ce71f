package federation

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/policy"
)

// testIdentity issues a certificate for 127.0.0.1 from ca, in files.
func testIdentity(t *testing.T, ca *tlsfilestest.CA, name string) Identity {
	t.Helper()
	caFile, certFile, keyFile := ca.WriteFiles(t, t.TempDir(), name, "127.0.0.1")
	f, err := tlsfiles.New(tlsfiles.Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
	must.NoError(t, err)
	id, err := FilesIdentity(f)
	must.NoError(t, err)
	return id
}

func enabled() policy.FederationSettings {
	s := policy.DefaultFederation()
	s.Enabled = true
	return s
}

// echo answers with whether the request arrived as forwarded.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.WriteString(w, "forwarded="+map[bool]string{true: "yes", false: "no"}[Forwarded(r.Context())]+
		" from="+r.Header.Get(FromHeader))
})

func startFed(t *testing.T, c Config) *Federation {
	t.Helper()
	if c.Policy == nil {
		c.Policy = enabled
	}
	if c.Local == nil {
		c.Local = func() []ModelSummary { return []ModelSummary{{Model: "m", Free: 4, TTFT: time.Millisecond}} }
	}
	if c.Handler == nil {
		c.Handler = echo
	}
	if c.Interval == 0 {
		c.Interval = 50 * time.Millisecond
	}
	f, err := New(c)
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f
}

func TestSummariesAndForwardingOverHTTP3(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "b"), Listen: "127.0.0.1:0"})
	a := startFed(t, Config{DC: "dc1", Identity: testIdentity(t, ca, "a"), Listen: "127.0.0.1:0",
		StaticPeers: []Peer{{DC: "dc2", Addr: b.Addr().String(), Models: []string{"m"}}}})
	a.Observe("m", []uint64{1, 2, 3})

	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return len(b.RemoteDCs()) == 1 }),
		wait.Timeout(5*time.Second), wait.Gap(20*time.Millisecond)))
	must.Eq(t, []string{"dc1"}, b.RemoteDCs())
	// b now knows a's prefixes: a request whose prompt a holds goes there.
	d := b.Route(Request{Model: "m", Keys: []uint64{1, 2, 3}, BlockSize: 4096,
		Local: Local{Healthy: true, PromptTokens: 3 * 4096, PrefillRate: 10000}})
	// b has never pushed to a (no peers), so its RTT is the pessimistic
	// PushTimeout (1 s): 1.2 s saved beats it.
	must.Eq(t, Decision{DC: "dc1", Reason: ReasonPrefix}, d)

	// A forwarded request arrives marked.
	tg, err := a.Begin(Decision{DC: "dc2", Reason: ReasonNoLocalWorker}, "m")
	must.NoError(t, err)
	req, _ := http.NewRequest(http.MethodPost, "https://"+tg.Addr+"/v1/chat/completions", strings.NewReader("{}"))
	req.Header.Set(FromHeader, "dc1")
	resp, err := a.Transport().RoundTrip(req)
	must.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	must.Eq(t, "forwarded=yes from=dc1", string(body))
	must.Eq(t, "HTTP/3.0", resp.Proto)
	a.End("dc2", true)
}

func TestMutualTLSRefusesOtherCA(t *testing.T) {
	ca, other := tlsfilestest.NewCA(t, "federation"), tlsfilestest.NewCA(t, "intruder")
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "b"), Listen: "127.0.0.1:0"})

	for name, id := range map[string]Identity{
		"client certificate from another CA": testIdentity(t, other, "x"),
		"no client certificate": {Client: func() *tls.Config {
			return &tls.Config{RootCAs: tlsfilestest.Pool(ca), MinVersion: tls.VersionTLS13}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			rt := id.clientTransport()
			defer rt.Close()
			if name != "no client certificate" {
				// Trust the server so only the client's certificate is in question.
				rt.TLSClientConfig.InsecureSkipVerify, rt.TLSClientConfig.VerifyConnection = true, nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+b.Addr().String()+SummaryPath, nil)
			resp, err := rt.RoundTrip(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			must.Error(t, err)
			must.Eq(t, 0, len(b.RemoteDCs()))
		})
	}
}

func TestNewValidates(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	id := testIdentity(t, ca, "a")
	noAuth := Identity{Server: func() *tls.Config { return &tls.Config{} }, Client: id.Client}
	local := func() []ModelSummary { return nil }
	for name, tc := range map[string]struct {
		c   Config
		err error
	}{
		"no dc":       {Config{Identity: id, Policy: enabled, Local: local}, ErrNoDC},
		"bad dc":      {Config{DC: "dc 1", Identity: id, Policy: enabled, Local: local}, ErrNoDC},
		"no identity": {Config{DC: "dc1", Policy: enabled, Local: local}, ErrNoIdentity},
		"server without client auth": {Config{DC: "dc1", Identity: noAuth, Policy: enabled, Local: local,
			Listen: "127.0.0.1:0", Handler: echo}, ErrNoClientAuth},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.c)
			must.ErrorIs(t, err, tc.err)
		})
	}
}
