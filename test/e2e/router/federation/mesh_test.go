package federation

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/quic-go/quic-go/http3"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/federation"
)

// TestFederationInTheMesh runs the federation link on the routers' Connect
// identities: dc2's leaf is signed by dc2's CA, an intermediate of dc1's
// root. dc1 has no engine, so its requests are forwarded to dc2 while the
// oasis-router → oasis-router intention allows it; revoked, they stop (dc1
// answers 404 itself: it has never had an engine for the model), and
// restored, they flow again.
func TestFederationInTheMesh(t *testing.T) {
	c1, c2 := testutil.StartConsulWAN(t)
	testutil.SetIntentions(t, c1.Client, "oasis-router", "oasis-router") // intentions are global under WAN federation
	ca := tlsfilestest.NewCA(t, "unused")                                // the mesh routers take no files
	dc1 := startDCWith(t, "dc1", c1, ca, dcOpts{engines: 0, mesh: true})
	dc2 := startDCWith(t, "dc2", c2, ca, dcOpts{engines: 1, mesh: true})
	for _, d := range []*dc{dc1, dc2} {
		testutil.Eventually(t, 30*time.Second, d.name+" to receive a summary over the mesh", func() bool {
			return d.metric(t, "oasis_router_federation_summary_age_seconds", nil) > 0
		})
	}
	resp, body := dc1.chat(t, 8)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	checkStream(t, body)
	must.Eq(t, 1.0, dc1.metric(t, "oasis_router_federation_forwarded_total", nil))

	// Anyone who may register a service in dc2 can name any address there, dc1's own router
	// included: dc1 refuses it, its certificate being dc1's, not dc2's.
	host, port, err := net.SplitHostPort(dc1.fed)
	must.NoError(t, err)
	p, _ := strconv.Atoi(port)
	must.NoError(t, c2.Client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{ID: "impostor",
		Name: federation.Service, Address: host, Port: p,
		Meta: map[string]string{federation.MetaDC: "dc2", federation.MetaModels: model}}))
	testutil.Eventually(t, 20*time.Second, "dc1 to refuse the impostor dc2 peer", func() bool {
		return dc1.metric(t, "oasis_router_federation_wrong_dc_peers_total", map[string]string{"dc": "dc2"}) > 0
	})
	must.NoError(t, c2.Client.Agent().ServiceDeregister("impostor"))

	// A dc1 router's certificate speaks for dc1 only: dc2 refuses its summary for dc3.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := meshid.New(ctx, meshid.Config{Consul: c1.Client, Service: "oasis-router"})
	must.NoError(t, err)
	defer id.Close()
	h3 := &http3.Transport{TLSClientConfig: id.ClientConfig("oasis-router", http3.NextProtoH3)}
	defer h3.Close()
	forged, err := (&federation.Summary{DC: "dc3", At: time.Now()}).MarshalBinary()
	must.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+dc2.fed+federation.SummaryPath, bytes.NewReader(forged))
	must.NoError(t, err)
	resp, err = h3.RoundTrip(req)
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, http.StatusForbidden, resp.StatusCode)

	testutil.SetIntentions(t, c1.Client, "oasis-router") // routers may no longer call each other
	revoked := time.Now()
	testutil.Eventually(t, 20*time.Second, "dc2 to refuse dc1's forwarded request", func() bool {
		resp, _ := dc1.chat(t, 8)
		return resp.StatusCode == http.StatusNotFound &&
			dc2.metric(t, "oasis_router_mesh_authorizations_total", map[string]string{"result": "denied"}) > 0
	})
	t.Logf("forwarding refused %v after the intention was revoked", time.Since(revoked).Round(10*time.Millisecond))

	testutil.SetIntentions(t, c1.Client, "oasis-router", "oasis-router") // intentions are global under WAN federation
	restored := time.Now()
	testutil.Eventually(t, 30*time.Second, "forwarding to resume", func() bool {
		resp, _ := dc1.chat(t, 8)
		return resp.StatusCode == http.StatusOK
	})
	t.Logf("forwarding resumed %v after the intention was restored", time.Since(restored).Round(10*time.Millisecond))
}
