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

	"github.com/quic-go/quic-go/http3"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/policy"
)

// testIdentity issues datacenter dc's router certificate for 127.0.0.1
// from ca, in files.
func testIdentity(t *testing.T, ca *tlsfilestest.CA, dc string) Identity {
	t.Helper()
	caFile, certFile, keyFile := ca.WriteRouterFiles(t, t.TempDir(), dc, "127.0.0.1")
	f, err := tlsfiles.New(tlsfiles.Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
	must.NoError(t, err)
	id, err := FilesIdentity(f)
	must.NoError(t, err)
	return id
}

// testClient is an HTTP/3 client with id for peers on 127.0.0.1, checking
// their certificate's name but not their datacenter: the listener's side of
// the checks is what its tests are about.
func testClient(id Identity) *http3.Transport {
	c := meshid.ForHost(id.Client(), "127.0.0.1")
	c.MinVersion = tls.VersionTLS13
	return &http3.Transport{TLSClientConfig: c, QUICConfig: quicConfig(), DisableCompression: true}
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
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0"})
	a := startFed(t, Config{DC: "dc1", Identity: testIdentity(t, ca, "dc1"), Listen: "127.0.0.1:0",
		StaticPeers: []Peer{{DC: "dc2", Addr: b.Addr().String(), Models: []string{"m"}}}})
	must.NoError(t, b.SetStaticPeers([]Peer{{DC: "dc1", Addr: a.Addr().String()}})) // b takes only listed datacenters'
	a.Observe("m", []uint64{1, 2, 3})

	testutil.EventuallyEvery(t, 5*time.Second, 20*time.Millisecond, "b to take a's summary", func() bool { return len(b.RemoteDCs()) == 1 })
	must.Eq(t, []string{"dc1"}, b.RemoteDCs())
	// b now knows a's prefixes: a request whose prompt a holds goes there.
	d := b.Route(Request{Model: "m", Keys: []uint64{1, 2, 3}, BlockSize: 4096,
		Local: Local{Healthy: true, PromptTokens: 3 * 4096, PrefillRate: 10000}})
	// 1.2 s of prefill saved beats b's round trip to a.
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
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0",
		StaticPeers: []Peer{{DC: "dc1", Addr: "127.0.0.1:1"}}})

	for name, id := range map[string]Identity{
		"client certificate from another CA": testIdentity(t, other, "dc1"),
		"no client certificate": {Client: func() *tls.Config {
			return &tls.Config{RootCAs: tlsfilestest.Pool(ca), MinVersion: tls.VersionTLS13}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			rt := testClient(id)
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
	id := testIdentity(t, ca, "dc1")
	noAuth := Identity{Server: func() *tls.Config { return &tls.Config{} }, Client: id.Client, PeerDC: id.PeerDC}
	local := func() []ModelSummary { return nil }
	for name, tc := range map[string]struct {
		c   Config
		err error
	}{
		"no dc":       {Config{Identity: id, Policy: enabled, Local: local}, ErrNoDC},
		"bad dc":      {Config{DC: "dc 1", Identity: id, Policy: enabled, Local: local}, ErrNoDC},
		"no identity": {Config{DC: "dc1", Policy: enabled, Local: local}, ErrNoIdentity},
		"no PeerDC": {Config{DC: "dc1", Identity: Identity{Server: id.Server, Client: id.Client}, Policy: enabled,
			Local: local}, ErrNoIdentity},
		"server without client auth": {Config{DC: "dc1", Identity: noAuth, Policy: enabled, Local: local,
			Listen: "127.0.0.1:0", Handler: echo}, ErrNoClientAuth},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.c)
			must.ErrorIs(t, err, tc.err)
		})
	}
}
