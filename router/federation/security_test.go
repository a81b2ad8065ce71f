package federation

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/bloom"
	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/internal/tlsfiles/pki"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/policy"
)

// Tests of issue #33 item 7: what a certificate of the federation CA can
// make a router do, on real HTTP/3 listeners with real TLS.

// plainIdentity is a certificate of ca for 127.0.0.1 that names no datacenter.
func plainIdentity(t *testing.T, ca *tlsfilestest.CA) Identity {
	t.Helper()
	caFile, certFile, keyFile := ca.WriteFiles(t, t.TempDir(), "plain", "127.0.0.1")
	f, err := tlsfiles.New(tlsfiles.Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
	must.NoError(t, err)
	id, err := FilesIdentity(f)
	must.NoError(t, err)
	return id
}

// post sends body to addr's path as id and returns the status and answer.
func post(t *testing.T, id Identity, addr, path string, body []byte) (int, string) {
	t.Helper()
	rt := testClient(id)
	defer rt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+path, strings.NewReader(string(body)))
	must.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func summaryOf(t *testing.T, dc string, prefixes *bloom.Filter) []byte {
	t.Helper()
	b, err := (&Summary{DC: dc, At: time.Now(), Models: []ModelSummary{{Model: "m", Free: 4, Prefixes: prefixes}}}).MarshalBinary()
	must.NoError(t, err)
	return b
}

// A summary is taken only for the datacenter the caller's certificate names,
// and only from a datacenter whose routers are listed: a certificate of the
// CA naming another datacenter, none, or an unlisted one cannot speak for
// dc1, nor fill the table with made-up datacenters (which used to lock a
// real new datacenter out until a restart).
func TestSummaryOnlyFromItsOwnListedDatacenter(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0",
		StaticPeers: []Peer{{DC: "dc1", Addr: "127.0.0.1:1"}, {DC: "dc3", Addr: "127.0.0.1:2"}}})
	addr := b.Addr().String()
	dc1, dc3 := testIdentity(t, ca, "dc1"), testIdentity(t, ca, "dc3")

	for i := range maxRemoteDCs {
		code, body := post(t, dc3, addr, SummaryPath, summaryOf(t, fmt.Sprintf("fake-%d", i), nil))
		must.EqOp(t, http.StatusForbidden, code, must.Sprint(body))
	}
	for name, tc := range map[string]struct {
		id      Identity
		dc      string
		wantErr error
	}{
		"another listed datacenter's certificate": {dc3, "dc1", ErrSummaryDC},
		"a certificate naming no datacenter":      {plainIdentity(t, ca), "dc1", ErrNoPeerDC},
		"an unlisted datacenter's certificate":    {testIdentity(t, ca, "dc9"), "dc9", ErrUnlistedDC},
		"this datacenter's own certificate":       {testIdentity(t, ca, "dc2"), "dc1", ErrOwnDC},
	} {
		t.Run(name, func(t *testing.T) {
			code, body := post(t, tc.id, addr, SummaryPath, summaryOf(t, tc.dc, nil))
			must.EqOp(t, http.StatusForbidden, code)
			must.StrContains(t, body, strings.TrimPrefix(tc.wantErr.Error(), "federation: "))
		})
	}
	must.Eq(t, []string{}, b.RemoteDCs())
	must.EqOp(t, float64(maxRemoteDCs+1), promtest.ToFloat64(b.m.badSummaries.WithLabelValues("wrong_dc")))

	code, body := post(t, dc1, addr, SummaryPath, summaryOf(t, "dc1", nil))
	must.EqOp(t, http.StatusNoContent, code, must.Sprint(body))
	must.Eq(t, []string{"dc1"}, b.RemoteDCs())

	// Forwarded requests too: an unlisted datacenter's certificate is refused.
	code, _ = post(t, testIdentity(t, ca, "dc9"), addr, "/v1/chat/completions", []byte("{}"))
	must.EqOp(t, http.StatusForbidden, code)
	code, body = post(t, dc1, addr, "/v1/chat/completions", []byte("{}"))
	must.EqOp(t, http.StatusOK, code)
	must.EqOp(t, "forwarded=yes from=", body)
}

// clock is a test clock the federation reads (Config.now).
type clock struct{ off atomic.Int64 }

func (c *clock) now() time.Time      { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) add(d time.Duration) { c.off.Add(int64(d)) }

// Remote state expires: a summary older than RemoteTTL is dropped, and a
// datacenter whose routers are no longer listed leaves the table, so a new
// datacenter takes its place.
func TestRemoteStateExpires(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	var clk clock
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0",
		RemoteTTL: time.Minute, StaticPeers: []Peer{{DC: "dc1", Addr: "127.0.0.1:1"}}, now: clk.now})
	addr := b.Addr().String()
	code, _ := post(t, testIdentity(t, ca, "dc1"), addr, SummaryPath, summaryOf(t, "dc1", nil))
	must.EqOp(t, http.StatusNoContent, code)
	must.Eq(t, []string{"dc1"}, b.RemoteDCs())

	// Still listed: the entry stays, its summary goes.
	clk.add(2 * time.Minute)
	testutil.Eventually(t, 10*time.Second, "dc1's summary to expire", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.remote["dc1"].routers) == 0
	})
	must.Eq(t, []string{"dc1"}, b.RemoteDCs())
	must.EqOp(t, 1.0, promtest.ToFloat64(b.m.expired))

	// No longer listed: the entry goes, and a new datacenter is taken.
	must.NoError(t, b.SetStaticPeers([]Peer{{DC: "dc4", Addr: "127.0.0.1:2"}}))
	testutil.Eventually(t, 10*time.Second, "the unlisted datacenter to leave the table", func() bool { return len(b.RemoteDCs()) == 0 })
	code, _ = post(t, testIdentity(t, ca, "dc4"), addr, SummaryPath, summaryOf(t, "dc4", nil))
	must.EqOp(t, http.StatusNoContent, code)
	must.Eq(t, []string{"dc4"}, b.RemoteDCs())
}

// A prefix filter that would match nearly anything (one byte of ones, all
// ones, or nearly full) is refused with a counter: it used to pull any
// request with a prompt to the sender.
func TestFullPrefixFilterRefused(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0",
		StaticPeers: []Peer{{DC: "dc1", Addr: "127.0.0.1:1"}}})
	dc1 := testIdentity(t, ca, "dc1")
	ones := func(bits int) *bloom.Filter {
		w := append([]byte{7, byte(bits), byte(bits >> 8), 0, 0}, []byte(strings.Repeat("\xff", bits/8))...)
		f, err := bloom.Unmarshal(w)
		must.NoError(t, err)
		return f
	}
	full := bloom.New(64)
	for i := range 640 {
		full.Add(PrefixKey(uint64(i)))
	}
	for i, f := range []*bloom.Filter{ones(8), ones(640), full} {
		code, body := post(t, dc1, b.Addr().String(), SummaryPath, summaryOf(t, "dc1", f))
		must.EqOp(t, http.StatusBadRequest, code)
		must.StrContains(t, body, "prefix filter refused")
		must.EqOp(t, float64(i+1), promtest.ToFloat64(b.m.badSummaries.WithLabelValues("filter")))
	}
	must.Eq(t, []string{}, b.RemoteDCs())
	must.Eq(t, Decision{}, b.Route(Request{Model: "m", Keys: []uint64{1 << 40}, BlockSize: 4096,
		Local: Local{Healthy: true, PromptTokens: 4096, PrefillRate: 100}}))

	good := NewHotKeys(1024)
	good.Add([]uint64{1, 2, 3})
	code, body := post(t, dc1, b.Addr().String(), SummaryPath, summaryOf(t, "dc1", good.Filter()))
	must.EqOp(t, http.StatusNoContent, code, must.Sprint(body))
}

// quicConn opens one QUIC connection to addr as id (its own socket) and
// sends one forwarded request on it.
func quicConn(t *testing.T, id Identity, addr string) (*http.Response, func(), error) {
	t.Helper()
	rt := testClient(id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/v1/models", nil)
	must.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return resp, func() { _ = rt.Close() }, err
}

// One address holds at most MaxConnsPerPeer connections to the listener:
// the next are closed as they arrive, and a place freed is taken again.
func TestConnectionsPerPeerBounded(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0",
		MaxConnsPerPeer: 2, StaticPeers: []Peer{{DC: "dc1", Addr: "127.0.0.1:1"}}})
	dc1, addr := testIdentity(t, ca, "dc1"), b.Addr().String()
	var closers []func()
	t.Cleanup(func() {
		for _, c := range closers {
			c()
		}
	})
	for range 2 {
		resp, c, err := quicConn(t, dc1, addr)
		closers = append(closers, c)
		must.NoError(t, err)
		must.EqOp(t, http.StatusOK, resp.StatusCode)
	}
	for range 2 {
		_, c, err := quicConn(t, dc1, addr)
		closers = append(closers, c)
		must.Error(t, err)
	}
	must.GreaterEq(t, 2.0, promtest.ToFloat64(b.m.connsRefused)) // the client may try again once

	closers[0]() // one place frees once the server sees the connection end
	testutil.Eventually(t, 10*time.Second, "a connection to be accepted once a place frees", func() bool {
		_, c, err := quicConn(t, dc1, addr)
		closers = append(closers, c)
		return err == nil
	})
}

// Requests forwarded from one datacenter are rate-limited at the listener
// (429, which the forwarding router serves itself).
func TestForwardedRequestsLimited(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0",
		ForwardedRate: 0.001, ForwardedBurst: 3, StaticPeers: []Peer{{DC: "dc1", Addr: "127.0.0.1:1"}}})
	dc1 := testIdentity(t, ca, "dc1")
	codes := map[int]int{}
	for range 5 {
		code, _ := post(t, dc1, b.Addr().String(), "/v1/chat/completions", []byte("{}"))
		codes[code]++
	}
	must.Eq(t, map[int]int{http.StatusOK: 3, http.StatusTooManyRequests: 2}, codes)
	must.EqOp(t, 2.0, promtest.ToFloat64(b.m.refused.WithLabelValues("dc1", "rate")))
}

// A stalling datacenter costs its half-open probe ProbeTimeout, not the
// request's own deadline.
func TestProbeTimeoutBoundsAStallingPeer(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	stall := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0", Handler: stall})
	pol := func() policy.FederationSettings {
		s := enabled()
		s.BreakerFailures, s.BreakerCooldown = 1, time.Millisecond
		return s
	}
	a := startFed(t, Config{DC: "dc1", Identity: testIdentity(t, ca, "dc1"), Listen: "127.0.0.1:0", Policy: pol,
		ProbeTimeout: 300 * time.Millisecond, StaticPeers: []Peer{{DC: "dc2", Addr: b.Addr().String()}}})
	must.NoError(t, b.SetStaticPeers([]Peer{{DC: "dc1", Addr: a.Addr().String()}}))

	_, err := a.Begin(Decision{DC: "dc2", Reason: ReasonNoLocalWorker}, "m")
	must.NoError(t, err)
	a.End("dc2", false) // open
	var tg Target
	testutil.Eventually(t, 10*time.Second, "the open breaker to let a probe through", func() bool {
		tg, err = a.Begin(Decision{DC: "dc2", Reason: ReasonNoLocalWorker}, "m")
		return err == nil
	})
	must.True(t, a.halfOpen("dc2"))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+tg.Addr+"/v1/chat/completions", strings.NewReader("{}"))
	start := time.Now()
	_, err = a.Transport().RoundTrip(req)
	must.ErrorIs(t, err, ErrProbeTimeout)
	must.Less(t, 20*time.Second, time.Since(start)) // not the request's minute
	a.End("dc2", false)
}

// The client checks, at the handshake, that the peer's certificate names
// the address dialled and the datacenter the peer was found for: a
// certificate of the CA for another address or datacenter gets nothing.
func TestDialChecksAddressAndDatacenter(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	for name, tc := range map[string]struct {
		id      Identity
		wantErr string
	}{
		"another datacenter's certificate": {testIdentity(t, ca, "dc3"), "another datacenter"},
		"another address's certificate": {func() Identity {
			caFile, certFile, keyFile := ca.WriteRouterFiles(t, t.TempDir(), "dc2", "127.0.0.2")
			f, err := tlsfiles.New(tlsfiles.Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
			must.NoError(t, err)
			id, err := FilesIdentity(f)
			must.NoError(t, err)
			return id
		}(), "127.0.0.1"},
	} {
		t.Run(name, func(t *testing.T) {
			got := atomic.Int64{}
			imposter := startFed(t, Config{DC: "dc2", Identity: tc.id, Listen: "127.0.0.1:0",
				Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) })})
			a := startFed(t, Config{DC: "dc1", Identity: testIdentity(t, ca, "dc1"), Listen: "127.0.0.1:0",
				StaticPeers: []Peer{{DC: "dc2", Addr: imposter.Addr().String()}}})
			must.NoError(t, imposter.SetStaticPeers([]Peer{{DC: "dc1", Addr: a.Addr().String()}}))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+imposter.Addr().String()+"/v1/chat/completions", strings.NewReader("{}"))
			_, err := a.Transport().RoundTrip(req)
			must.ErrorContains(t, err, tc.wantErr)
			must.EqOp(t, 0, got.Load())
			imposter.mu.Lock()
			rd := imposter.remote["dc1"]
			must.True(t, rd == nil || rd.received.IsZero(), must.Sprint("a's summary reached it")) // it may have pushed to a
			imposter.mu.Unlock()
		})
	}
}

// The HTTP/2 client makes the same checks per dial, and LimitListener
// bounds a TLS listener per address.
func TestHTTP2ClientAndLimitedListener(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	idB := testIdentity(t, ca, "dc2")
	b, err := New(Config{DC: "dc2", Identity: idB, Policy: enabled, Local: func() []ModelSummary { return nil },
		MaxConnsPerPeer: 1})
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, b.Close()) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	tc := idB.Server()
	tc.NextProtos = []string{"h2"}
	srv := &http.Server{Handler: b.Handler(), TLSConfig: tc}
	go func() { _ = srv.ServeTLS(b.LimitListener(ln), "", "") }()
	t.Cleanup(func() { _ = srv.Close() })

	_ = startFed(t, Config{DC: "dc1", Identity: testIdentity(t, ca, "dc1"), HTTP2: true,
		StaticPeers: []Peer{{DC: "dc2", Addr: ln.Addr().String()}}})
	must.NoError(t, b.SetStaticPeers([]Peer{{DC: "dc1", Addr: "127.0.0.1:1"}}))
	testutil.Eventually(t, 10*time.Second, "dc1's first summary to reach b", func() bool { return len(b.RemoteDCs()) == 1 })

	// A second connection from the same address is closed on arrival.
	c := meshid.ForHost(testIdentity(t, ca, "dc1").Client(), "127.0.0.1")
	c.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", ln.Addr().String(), c)
	if err == nil {
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		_ = conn.Close()
	}
	must.Error(t, err)
	must.False(t, errors.Is(err, context.DeadlineExceeded))
	must.EqOp(t, 1.0, promtest.ToFloat64(b.m.connsRefused))
}

// pkiIdentity is a files identity for a certificate pki issued from ca.
func pkiIdentity(t *testing.T, ca *pki.CA, s pki.Spec) Identity {
	t.Helper()
	l, err := ca.Issue(s)
	must.NoError(t, err)
	dir := t.TempDir()
	f, err := tlsfiles.New(tlsfiles.Config{CertFile: tlsfilestest.WriteFile(t, dir, "c.pem", l.CertPEM),
		KeyFile: tlsfilestest.WriteFile(t, dir, "k.pem", l.KeyPEM), ClientCAFile: tlsfilestest.WriteFile(t, dir, "ca.pem", ca.CertPEM)})
	must.NoError(t, err)
	id, err := FilesIdentity(f)
	must.NoError(t, err)
	return id
}

// Only a router's identity speaks for a datacenter: another service's
// certificate of the same CA naming dc1 (kvcached's, say) does not.
func TestAnotherServicesCertificateRefused(t *testing.T) {
	ca, err := pki.NewCA("federation", time.Hour)
	must.NoError(t, err)
	router := func(dc string) Identity {
		return pkiIdentity(t, ca, pki.Spec{CommonName: dc, Hosts: []string{"127.0.0.1"}, URIs: []*url.URL{pki.RouterURI(dc)}, Validity: time.Hour})
	}
	b := startFed(t, Config{DC: "dc2", Identity: router("dc2"), Listen: "127.0.0.1:0",
		StaticPeers: []Peer{{DC: "dc1", Addr: "127.0.0.1:1"}}})
	kv := pkiIdentity(t, ca, pki.Spec{CommonName: "kv", Hosts: []string{"127.0.0.1"}, Validity: time.Hour,
		URIs: []*url.URL{{Scheme: "spiffe", Host: "oasis", Path: "/ns/default/dc/dc1/svc/oasis-kvcached"}}})
	code, body := post(t, kv, b.Addr().String(), SummaryPath, summaryOf(t, "dc1", nil))
	must.EqOp(t, http.StatusForbidden, code)
	must.StrContains(t, body, "names no datacenter")
	code, _ = post(t, router("dc1"), b.Addr().String(), SummaryPath, summaryOf(t, "dc1", nil))
	must.EqOp(t, http.StatusNoContent, code)
}
