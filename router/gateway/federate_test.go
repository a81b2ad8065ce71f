package gateway

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// fedDC is one datacenter of a federated pair: a gateway and its federation.
type fedDC struct {
	h    *harness
	fed  *federation.Federation
	reg  *prometheus.Registry // the federation's metrics
	addr func() string        // its federation listener
}

// serveH2 serves h over HTTP/2 with TLS, requiring client certificates.
func serveH2(t testing.TB, files *tlsfiles.Files, h http.Handler) func() string {
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = files.ServerConfig()
	srv.TLS.MinVersion = tls.VersionTLS13
	srv.TLS.NextProtos = []string{"h2"}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return func() string { return srv.Listener.Addr().String() }
}

// fedPair starts two gateways in dc1 and dc2 whose federations know each
// other over HTTP/3, with engines per datacenter (as setEngines takes them).
func fedPair(t testing.TB, e1, e2 map[string]string) (dc1, dc2 *fedDC) {
	return fedPairOver(t, false, nil, e1, e2)
}

// fedPairOver is fedPair, over HTTP/2 with TLS instead when h2, with doc as
// both datacenters' policy (nil: federation on, round robin).
func fedPairOver(t testing.TB, h2 bool, doc *policy.Document, e1, e2 map[string]string) (dc1, dc2 *fedDC) {
	t.Helper()
	ca := tlsfilestest.NewCA(t, "federation")
	if doc == nil {
		on := true
		// m is in the policy: a router without a worker for it answers 503, not 404.
		doc = &policy.Document{Policy: scoring.RoundRobin, Federation: &policy.Federation{Enabled: &on},
			Models: map[string]policy.Model{"m": {}}}
	}
	mk := func(dc string, engines map[string]string) *fedDC {
		caFile, certFile, keyFile := ca.WriteRouterFiles(t, t.TempDir(), dc, "127.0.0.1")
		files, err := tlsfiles.New(tlsfiles.Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
		must.NoError(t, err)
		d := &fedDC{reg: prometheus.NewRegistry()}
		var gw atomic.Pointer[Gateway] // the federation and the gateway each need the other
		listen := "127.0.0.1:0"
		if h2 {
			listen = ""
		}
		id, err := federation.FilesIdentity(files)
		must.NoError(t, err)
		d.fed, err = federation.New(federation.Config{DC: dc, Identity: id,
			Listen: listen, HTTP2: h2, Interval: 50 * time.Millisecond, Registerer: d.reg,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gw.Load().ForwardedHandler().ServeHTTP(w, r)
			}),
			Policy: func() policy.FederationSettings { return doc.FederationSettings() },
			Local:  func() []federation.ModelSummary { return gw.Load().FederationSummary() }})
		must.NoError(t, err)
		d.h = newHarnessWith(t, Config{Federation: d.fed}, doc, engines)
		gw.Store(d.h.gw)
		d.addr = func() string { return d.fed.Addr().String() }
		if h2 {
			d.addr = serveH2(t, files, d.fed.Handler())
		}
		return d
	}
	dc1, dc2 = mk("dc1", e1), mk("dc2", e2)
	must.NoError(t, dc1.fed.SetStaticPeers([]federation.Peer{{DC: "dc2", Addr: dc2.addr()}}))
	must.NoError(t, dc2.fed.SetStaticPeers([]federation.Peer{{DC: "dc1", Addr: dc1.addr()}}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, d := range []*fedDC{dc1, dc2} {
		wg.Add(1)
		go func() { defer wg.Done(); d.fed.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	// Each must have the other's summary (its models) before a test routes:
	// RemoteDCs lists a datacenter as soon as a push to it succeeded, which
	// under load can be well before its own first summary arrives.
	for d, other := range map[*fedDC]string{dc1: "dc2", dc2: "dc1"} {
		testutil.EventuallyEvery(t, 5*time.Second, 20*time.Millisecond, "the first summary from "+other, func() bool { return summaryFrom(t, d, other) })
	}
	return dc1, dc2
}

// summaryFrom reports whether d has received a summary from datacenter dc:
// its summary_age_seconds gauge has a series for dc.
func summaryFrom(t testing.TB, d *fedDC, dc string) bool {
	t.Helper()
	mfs, err := d.reg.Gather()
	must.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "oasis_router_federation_summary_age_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "dc" && l.GetValue() == dc {
					return true
				}
			}
		}
	}
	return false
}

// forwardedCount sums oasis_router_federation_forwarded_total over its series.
func forwardedCount(t testing.TB, d *fedDC) int {
	t.Helper()
	return int(counterSum(t, d.reg, "oasis_router_federation_forwarded_total"))
}

func counterSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

const streamBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`

func TestFederationLocalFirst(t *testing.T) {
	var local, remote atomic.Int64
	e1, e2 := goodEngine(t, &local), goodEngine(t, &remote)
	dc1, _ := fedPair(t, map[string]string{"a": "m@" + addr(e1)}, map[string]string{"b": "m@" + addr(e2)})
	for range 5 {
		resp := dc1.h.post("/v1/chat/completions", streamBody)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		must.Eq(t, http.StatusOK, resp.StatusCode)
	}
	must.Eq(t, 5, local.Load())
	must.Eq(t, 0, remote.Load())
	must.Eq(t, 0, forwardedCount(t, dc1))
}

func TestFederationNoLocalWorkerStreamsFromOtherDC(t *testing.T) {
	var remote atomic.Int64
	e2 := goodEngine(t, &remote)
	direct := dcStream(t, addr(e2))
	dc1, _ := fedPair(t, map[string]string{"x": "other@" + deadAddr(t)}, map[string]string{"b": "m@" + addr(e2)})
	resp := dc1.h.post("/v1/chat/completions", streamBody)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, "text/event-stream", resp.Header.Get("Content-Type"))
	must.Eq(t, direct, string(body)) // the engine's stream, byte for byte
	must.Eq(t, 2, remote.Load())     // the direct read and the forwarded one
	must.Eq(t, 1, forwardedCount(t, dc1))
}

// dc1's only worker is dead but still listed (discovery has not dropped
// it yet): the request fails there before its first byte and is served by
// dc2 instead of answered 502.
func TestFederationLocalFailureGoesToOtherDC(t *testing.T) {
	var remote atomic.Int64
	e2 := goodEngine(t, &remote)
	dc1, dc2 := fedPair(t, map[string]string{"x": "m@" + deadAddr(t)}, map[string]string{"b": "m@" + addr(e2)})
	resp := dc1.h.post("/v1/chat/completions", streamBody)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(string(body)))
	must.StrContains(t, string(body), "data: [DONE]")
	must.Eq(t, 1, remote.Load())
	must.Eq(t, 1, forwardedCount(t, dc1))
	must.Eq(t, 0, forwardedCount(t, dc2))
}

// dcStream reads the engine's answer directly, the reference stream.
func dcStream(t *testing.T, engine string) string {
	t.Helper()
	resp, err := http.Post("http://"+engine+"/v1/chat/completions", "application/json", strings.NewReader(streamBody))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestFederationOneHopOnly(t *testing.T) {
	// dc1's only worker for m is dead; dc2 has none. Entering at dc2 a
	// request goes to dc1 once (no local worker), fails there before its
	// first byte (dc1 serves forwarded requests locally: 502) and dc2
	// answers 503 with Retry-After itself. The same request arriving at
	// dc2 forwarded, over the federation listener, is never sent on.
	dc1, dc2 := fedPair(t, map[string]string{"x": "m@" + deadAddr(t)}, map[string]string{"y": "other@" + deadAddr(t)})
	resp := dc2.h.post("/v1/chat/completions", streamBody)
	_ = resp.Body.Close()
	must.Eq(t, http.StatusServiceUnavailable, resp.StatusCode)
	must.NotEq(t, "", resp.Header.Get("Retry-After"))
	must.Eq(t, 1, forwardedCount(t, dc2))
	must.Eq(t, 0, forwardedCount(t, dc1))

	req, err := http.NewRequest(http.MethodPost, "https://"+dc2.fed.Addr().String()+"/v1/chat/completions",
		strings.NewReader(streamBody))
	must.NoError(t, err)
	resp, err = dc1.fed.Transport().RoundTrip(req)
	must.NoError(t, err)
	_ = resp.Body.Close()
	must.Eq(t, http.StatusServiceUnavailable, resp.StatusCode)
	must.Eq(t, 1, forwardedCount(t, dc2)) // still the one above
	must.Eq(t, 1.0, counterSum(t, dc2.reg, "oasis_router_federation_forward_failures_total"))
}

func TestFederationSaturatedSpills(t *testing.T) {
	release := make(chan struct{})
	var local, remote atomic.Int64
	slow := sseEngineFunc(t, func(_ http.ResponseWriter, r *http.Request, send func(string)) {
		local.Add(1)
		send(roleChunk)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		send(tokenChunk("late") + "data: [DONE]\n\n")
	})
	on, spill, one, none := true, 1.0, 1, 0
	doc := &policy.Document{Policy: scoring.RoundRobin,
		Admission:  policy.Admission{MaxInFlight: &one, MaxQueue: &none},
		Federation: &policy.Federation{Enabled: &on, MaxSpillFraction: &spill}}
	dc1, _ := fedPairOver(t, false, doc, map[string]string{"a": "m@" + addr(slow)},
		map[string]string{"b": "m@" + addr(goodEngine(t, &remote))})
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unhold) // runs first: a failed assertion must not leave the slow engine holding the servers' Close

	first := make(chan int, 1)
	go func() {
		resp := dc1.h.post("/v1/chat/completions", streamBody)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		first <- resp.StatusCode
	}()
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "the first request to hold dc1's only slot", func() bool { return local.Load() == 1 })
	// dc1's only slot is taken and it queues nothing: the next request
	// goes to dc2 instead of a 429.
	resp := dc1.h.post("/v1/chat/completions", streamBody)
	body := readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.StrContains(t, body, "data: [DONE]")
	must.Eq(t, 1, remote.Load())
	must.Eq(t, 1, forwardedCount(t, dc1))
	unhold()
	must.Eq(t, http.StatusOK, <-first)
}

func TestRemoteRequestHeaders(t *testing.T) {
	dc1, _ := fedPair(t, map[string]string{"x": "other@" + deadAddr(t)}, map[string]string{"y": "other@" + deadAddr(t)})
	tg := &federation.Target{DC: "dc2", Addr: "127.0.0.1:9443", RTT: 40 * time.Millisecond}
	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none
		min, max int           // X-Oasis-Deadline-Ms sent; 0, 0: none
	}{
		{name: "no deadline"},
		{name: "deadline cut by the RTT", deadline: time.Second, min: 900, max: 960},
		{name: "deadline shorter than the RTT", deadline: 10 * time.Millisecond, min: 1, max: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			up, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://engine/v1/chat/completions", nil)
			must.NoError(t, err)
			up.Header.Set("Authorization", "Bearer client-key")
			up.Header.Set(DeadlineHeader, "999999")
			dc1.h.gw.remoteRequest(ctx, up, tg)
			must.Eq(t, "https://127.0.0.1:9443/v1/chat/completions", up.URL.String())
			must.Eq(t, "", up.Header.Get("Authorization"))
			must.Eq(t, "dc1", up.Header.Get(federation.FromHeader))
			got := up.Header.Get(DeadlineHeader)
			if tc.max == 0 {
				must.Eq(t, "", got)
				return
			}
			ms, err := strconv.Atoi(got)
			must.NoError(t, err)
			must.Between(t, tc.min, ms, tc.max)
		})
	}
}

// With the datacenter's routers sharing max_in_flight, local pressure is
// measured against this router's share: one request in flight fills a share
// of 1 of a cap of 4, and a second would wait.
func TestLocalPressureUsesThisRoutersShare(t *testing.T) {
	lim := policy.Limits{MaxInFlight: 4, MaxQueue: 8, QueueTimeout: time.Second}
	for _, tc := range []struct {
		name     string
		share    func(string, int) int
		waitMore bool
	}{
		{"alone: the whole cap", nil, false},
		{"a share of 1", func(string, int) int { return 1 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctrl := admission.New()
			ctrl.Share = tc.share
			g := &Gateway{cfg: Config{Admission: ctrl}}
			release, err := ctrl.Acquire(context.Background(), "m", lim)
			must.NoError(t, err)
			defer release()
			saturated, wait := g.localPressure("m", lim)
			must.False(t, saturated)
			must.Eq(t, tc.waitMore, wait > 0)
		})
	}
}
