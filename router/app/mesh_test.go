package app

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/discovery"
)

// meshBed is a Consul dev agent (Connect on) with an engine behind Consul's
// built-in sidecar proxy, default-deny intentions, and a router that serves
// only mesh clients and reaches the engine only through the mesh.
type meshBed struct {
	consul *consulapi.Client
	router *running
}

func startMeshBed(t *testing.T, eng *engine) *meshBed {
	t.Helper()
	c, addr := testutil.StartConsul(t)
	b := &meshBed{consul: c}
	testutil.SetIntentions(t, b.consul, "oasis-router", "web")
	testutil.SetIntentions(t, b.consul, "oasis-engine", "oasis-router")
	host, portS, _ := net.SplitHostPort(strings.TrimPrefix(eng.URL, "http://"))
	port, _ := strconv.Atoi(portS)
	sidecar := testutil.FreePort(t)
	must.NoError(t, c.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: "engine-1", Name: discovery.EngineService, Address: host, Port: port,
		Meta: map[string]string{discovery.MetaModel: "m"},
		Connect: &consulapi.AgentServiceConnect{SidecarService: &consulapi.AgentServiceRegistration{
			Port: sidecar, Checks: consulapi.AgentServiceChecks{
				{Name: "listening", TCP: net.JoinHostPort("127.0.0.1", strconv.Itoa(sidecar)), Interval: "1s"},
				{Name: "engine", AliasService: "engine-1"}}}}}))
	testutil.Start(t, exec.Command(testutil.ConsulBinary(), "connect", "proxy", "-sidecar-for", "engine-1",
		"-http-addr", addr, "-log-level", "warn"))

	cfg := baseConfig(t)
	cfg.Discovery, cfg.ConsulAddr, cfg.Engines = DiscoveryConsul, addr, nil
	cfg.Listen, cfg.MeshService, cfg.MeshListen, cfg.MeshEngines = ListenOff, "oasis-router", "127.0.0.1:0", true
	b.router = start(t, cfg)
	testutil.Eventually(t, 20*time.Second, "the engine's sidecar in the pool", func() bool {
		ws := b.router.Pool().Workers("m")
		return len(ws) == 1 && ws[0].Address == net.JoinHostPort("127.0.0.1", strconv.Itoa(sidecar))
	})
	return b
}

// client is an HTTP client in the mesh as service svc, calling the router.
func (b *meshBed) client(t *testing.T, svc string) *http.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := meshid.New(ctx, meshid.Config{Consul: b.consul, Service: svc})
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, id.Close()) })
	tr := &http.Transport{TLSClientConfig: id.ClientConfig("oasis-router", "h2", "http/1.1"), ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func (b *meshBed) url() string { return "https://" + b.router.MeshAddr().String() }

func TestMeshClientRouterSidecarEngine(t *testing.T) {
	b := startMeshBed(t, newEngine(t, 3, 0))
	web := b.client(t, "web")

	resp := complete(t, web, b.url(), true)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.EqOp(t, 2, resp.ProtoMajor) // HTTP/2 by ALPN over the mesh certificate
	must.Eq(t, wantEvents(3), readEvents(t, resp.Body))

	// No intention lets "intruder" call the router: refused at the handshake (the client sees a
	// TLS alert or the connection reset, by timing), counted as denied.
	_, err := b.client(t, "intruder").Get(b.url() + "/health")
	must.Error(t, err)
	must.Positive(t, meshDenied(t, b.router.reg))

	// Revoking web's intention stops its open connection too, at the next request.
	testutil.SetIntentions(t, b.consul, "oasis-router")
	testutil.Eventually(t, 10*time.Second, "web's next request on its connection to be refused", func() bool {
		resp := complete(t, web, b.url(), false)
		return resp.StatusCode == http.StatusForbidden && resp.ProtoMajor == 2
	})
	resp = complete(t, web, b.url(), false)
	must.Eq(t, "permission_denied", errorCode(t, resp))
}

// meshDenied is the router's count of callers the intentions refused.
func meshDenied(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must.NoError(t, err)
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "oasis_router_mesh_authorizations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "denied" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

func errorCode(t *testing.T, resp *http.Response) string {
	t.Helper()
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	return e.Error.Code
}

func TestMeshEngineIntentionRemovedAndRestored(t *testing.T) {
	b := startMeshBed(t, newEngine(t, 3, 0))
	web := b.client(t, "web")
	must.Eq(t, http.StatusOK, complete(t, web, b.url(), false).StatusCode)

	testutil.SetIntentions(t, b.consul, "oasis-engine") // the router may no longer call engines
	testutil.Eventually(t, 15*time.Second, "requests to fail without the router → engine intention", func() bool {
		return complete(t, web, b.url(), false).StatusCode == http.StatusServiceUnavailable
	})
	testutil.SetIntentions(t, b.consul, "oasis-engine", "oasis-router")
	start := time.Now()
	testutil.Eventually(t, 15*time.Second, "requests to succeed once the intention is back", func() bool {
		return complete(t, web, b.url(), false).StatusCode == http.StatusOK
	})
	t.Logf("recovered %s after the intention was restored", time.Since(start).Round(time.Millisecond))
}

// TestMeshRotationDuringStream rotates the CA (new roots, new leaves for
// every service) while a stream runs through client → router → sidecar →
// engine: the stream ends whole, and new requests work with the new leaves.
func TestMeshRotationDuringStream(t *testing.T) {
	b := startMeshBed(t, newEngine(t, 40, 250*time.Millisecond))
	web := b.client(t, "web")
	resp := complete(t, web, b.url(), true)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	before := b.router.mesh.Serial()

	testutil.RotateConnectCA(t, b.consul)

	must.Eq(t, wantEvents(40), readEvents(t, resp.Body)) // ~10 s: the rotation lands meanwhile
	testutil.Eventually(t, 30*time.Second, "the router's new leaf", func() bool { return b.router.mesh.Serial() != before })
	b.router.engines.CloseIdleConnections() // new connections, made with the new leaves
	testutil.Eventually(t, 30*time.Second, "a request with the new leaves", func() bool {
		return complete(t, b.client(t, "web"), b.url(), false).StatusCode == http.StatusOK
	})
}
