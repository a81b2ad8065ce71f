package meshid

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	oasistest "github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

func newIdentity(t *testing.T, c *consulapi.Client, service string, reg prometheus.Registerer) *Identity {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := New(ctx, Config{Consul: c, Service: service, Registerer: reg})
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, id.Close()) })
	return id
}

// serve runs an HTTPS server with the identity's server configuration that
// answers with the caller's mesh service.
func serve(t *testing.T, id *Identity) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, PeerService(*r.TLS))
	}))
	srv.TLS = id.ServerConfig("http/1.1")
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func client(id *Identity, service string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: id.ClientConfig(service)}}
}

func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestConsulIntentionsDecideAtTheHandshake(t *testing.T) {
	c, _ := oasistest.StartConsul(t)
	reg := prometheus.NewRegistry()
	engine := newIdentity(t, c, "oasis-engine", reg)
	router := newIdentity(t, c, "oasis-router", nil)
	web := newIdentity(t, c, "web", nil)
	must.True(t, engine.Mesh())
	must.StrContains(t, engine.TrustDomain(), ".consul")
	oasistest.SetIntentions(t, c, "oasis-engine", "oasis-router")
	srv := serve(t, engine)

	got, err := get(client(router, "oasis-engine"), srv.URL)
	must.NoError(t, err)
	must.EqOp(t, "oasis-router", got) // the server sees the caller's service

	_, err = get(client(web, "oasis-engine"), srv.URL)
	must.Error(t, err) // refused at the handshake
	must.EqOp(t, 1.0, testutil.ToFloat64(engine.m.authorizations.WithLabelValues("denied", "false")))

	// The caller checks whom it reached: the engine is not oasis-kvcached.
	_, err = get(client(router, "oasis-kvcached"), srv.URL)
	must.ErrorContains(t, err, `not service "oasis-kvcached"`)

	// Later connections of the router are authorized from the cache. (The
	// intention watch's first answer may drop the cache once: the decision
	// made before it is then asked again, and cached from there on.)
	oasistest.Eventually(t, 10*time.Second, "a connection authorized from the cache", func() bool {
		_, err := get(&http.Client{Transport: &http.Transport{TLSClientConfig: router.ClientConfig("oasis-engine")}}, srv.URL)
		return err == nil && testutil.ToFloat64(engine.m.authorizations.WithLabelValues("allowed", "true")) > 0
	})
}

func TestIntentionChangeDropsCachedAuthorizations(t *testing.T) {
	c, _ := oasistest.StartConsul(t)
	engine := newIdentity(t, c, "oasis-engine", nil)
	router := newIdentity(t, c, "oasis-router", nil)
	oasistest.SetIntentions(t, c, "oasis-engine", "oasis-router")
	srv := serve(t, engine)
	_, err := get(client(router, "oasis-engine"), srv.URL)
	must.NoError(t, err)

	oasistest.SetIntentions(t, c, "oasis-engine") // the router is denied now
	// AuthorizeTTL is a minute: only the intention watch can make this fail sooner.
	oasistest.Eventually(t, 10*time.Second, "the router refused", func() bool {
		_, err = get(client(router, "oasis-engine"), srv.URL)
		return err != nil
	})
	must.Positive(t, testutil.ToFloat64(engine.m.intentionChanges))
}

// TestRotationKeepsConnections replaces the CA's key, which makes Consul
// issue new roots and new leaves: a connection made before keeps working and
// a new one is made with the new leaf.
func TestRotationKeepsConnections(t *testing.T) {
	c, _ := oasistest.StartConsul(t)
	engine := newIdentity(t, c, "oasis-engine", nil)
	router := newIdentity(t, c, "oasis-router", nil)
	srv := serve(t, engine)
	tr := &http.Transport{TLSClientConfig: router.ClientConfig("oasis-engine"), MaxConnsPerHost: 1}
	old := &http.Client{Transport: tr}
	_, err := get(old, srv.URL)
	must.NoError(t, err)
	before := engine.consul.Load().serial

	oasistest.RotateConnectCA(t, c)
	oasistest.Eventually(t, 30*time.Second, "new leaves after the CA change", func() bool {
		return engine.consul.Load().serial != before && router.consul.Load().serial != before
	})
	_, err = get(old, srv.URL) // the kept-alive connection, made with the old leaves
	must.NoError(t, err)
	var seen *x509.Certificate
	fresh := &tls.Config{}
	*fresh = *router.ClientConfig("oasis-engine")
	fresh.VerifyConnection = func(cs tls.ConnectionState) error {
		seen = cs.PeerCertificates[0]
		return router.verifyServer(cs, "oasis-engine")
	}
	conn, err := tls.Dial("tcp", strings.TrimPrefix(srv.URL, "https://"), fresh)
	must.NoError(t, err)
	must.NoError(t, conn.Close())
	must.EqOp(t, engine.consul.Load().serial, encodeSerial(seen.SerialNumber.Bytes()))
}

func TestFilesIdentity(t *testing.T) {
	ca, other := tlsfilestest.NewCA(t, "oasis"), tlsfilestest.NewCA(t, "other")
	dir := t.TempDir()
	files := func(ca *tlsfilestest.CA, name string) *tlsfiles.Files {
		caFile, cert, key := ca.WriteFiles(t, dir, name, "localhost", "127.0.0.1")
		f, err := tlsfiles.New(tlsfiles.Config{CertFile: cert, KeyFile: key, ClientCAFile: caFile})
		must.NoError(t, err)
		return f
	}
	server, err := New(context.Background(), Config{Files: files(ca, "server")})
	must.NoError(t, err)
	must.False(t, server.Mesh())
	good, err := New(context.Background(), Config{Files: files(ca, "client")})
	must.NoError(t, err)
	stranger, err := New(context.Background(), Config{Files: files(other, "stranger")})
	must.NoError(t, err)
	srv := serve(t, server)
	addr := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)

	_, err = get(client(good, ""), addr)
	must.NoError(t, err)
	_, err = get(client(stranger, ""), addr)
	must.Error(t, err) // its CA is not the server's
}

// A files identity dialling verifies servers against the CA bundle as it is
// at each handshake, and their name against ServerName.
func TestFilesClientFollowsTheBundle(t *testing.T) {
	dir := t.TempDir()
	clientCA, serverCA, otherCA := tlsfilestest.NewCA(t, "clients"), tlsfilestest.NewCA(t, "servers"), tlsfilestest.NewCA(t, "other")
	_, certFile, keyFile := clientCA.WriteFiles(t, dir, "peer", "peer.test")
	caFile := tlsfilestest.WriteFile(t, dir, "servers.pem", otherCA.PEM)
	f, err := tlsfiles.New(tlsfiles.Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
	must.NoError(t, err)
	id, err := New(context.Background(), Config{Files: f})
	must.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCA.Issue(t, "server", "127.0.0.1").TLS(t)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: tlsfilestest.Pool(clientCA)}
	srv.StartTLS()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")

	_, err = tls.Dial("tcp", addr, id.ClientConfig(""))
	must.ErrorContains(t, err, "unknown authority") // the server's CA is not in the bundle yet

	tlsfilestest.WriteFile(t, dir, "servers.pem", append(otherCA.PEM, serverCA.PEM...))
	must.NoError(t, f.Reload())
	got, err := get(&http.Client{Transport: &http.Transport{TLSClientConfig: ForHost(id.ClientConfig(""), "127.0.0.1")}}, srv.URL)
	must.NoError(t, err)
	must.EqOp(t, "ok", got)

	cfg := id.ClientConfig("")
	cfg.ServerName = "elsewhere.test"
	_, err = tls.Dial("tcp", addr, cfg)
	must.Error(t, err) // the name is checked too
}

// A files identity dialling a peer by IP address checks the address: crypto/tls
// reports no server name for an IP literal, so the plain configuration refuses
// (it used to accept any certificate of the CA), and ForHost checks the
// dialled address against the certificate's IP SANs.
func TestFilesClientChecksTheDialledAddress(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "oasis")
	dir := t.TempDir()
	caFile, certFile, keyFile := ca.WriteFiles(t, dir, "client", "client.test")
	f, err := tlsfiles.New(tlsfiles.Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile})
	must.NoError(t, err)
	id, err := New(context.Background(), Config{Files: f})
	must.NoError(t, err)
	start := func(names ...string) string {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "server", names...).TLS(t)}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	elsewhere := start("127.0.0.2", "other.test") // another node's certificate, served at 127.0.0.1
	here := start("127.0.0.1")
	via := func(c *tls.Config) *http.Client {
		tr := &http.Transport{TLSClientConfig: c}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Timeout: 10 * time.Second, Transport: tr}
	}

	_, err = get(via(id.ClientConfig("")), elsewhere)
	must.ErrorIs(t, err, ErrNoServerName)
	_, err = get(via(ForHost(id.ClientConfig(""), "127.0.0.1")), elsewhere)
	must.ErrorContains(t, err, "127.0.0.1")
	got, err := get(via(ForHost(id.ClientConfig(""), "127.0.0.1")), here)
	must.NoError(t, err)
	must.EqOp(t, "ok", got)
}

func TestNewRefusesBadConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  Config
		want error
	}{
		"nothing":       {Config{}, ErrNoSource},
		"no service":    {Config{Consul: &consulapi.Client{}}, ErrNoService},
		"files no cert": {Config{Files: caOnly(t)}, ErrNoCertificate},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(context.Background(), tc.cfg)
			must.True(t, errors.Is(err, tc.want), must.Sprint(err))
		})
	}
}

func caOnly(t *testing.T) *tlsfiles.Files {
	caFile, _, _ := tlsfilestest.NewCA(t, "oasis").WriteFiles(t, t.TempDir(), "x", "localhost")
	f, err := tlsfiles.New(tlsfiles.Config{ClientCAFile: caFile})
	must.NoError(t, err)
	return f
}

func TestParseSpiffeID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want SpiffeID
		ok   bool
	}{
		{"spiffe://11111111-2222.consul/ns/default/dc/dc1/svc/oasis-router",
			SpiffeID{TrustDomain: "11111111-2222.consul", Namespace: "default", Datacenter: "dc1", Service: "oasis-router"}, true},
		{"spiffe://td.consul/ap/part/ns/team/dc/dc2/svc/web",
			SpiffeID{TrustDomain: "td.consul", Namespace: "team", Datacenter: "dc2", Service: "web"}, true},
		{"spiffe://td.consul/agent/client/dc/dc1/id/node", SpiffeID{}, false}, // an agent, not a service
		{"spiffe://td.consul/ns/default/dc/dc1", SpiffeID{}, false},
		{"spiffe://td.consul/ns//dc/dc1/svc/x", SpiffeID{}, false},
		{"https://td.consul/ns/default/dc/dc1/svc/x", SpiffeID{}, false},
		{"spiffe:///ns/default/dc/dc1/svc/x", SpiffeID{}, false},
		{"spiffe://td.consul/ns/default/dc/dc1/svc/x?q=1", SpiffeID{}, false},
		{"::", SpiffeID{}, false},
	} {
		got, err := ParseSpiffeID(tc.in)
		if !tc.ok {
			must.True(t, errors.Is(err, ErrNotSpiffe), must.Sprint(tc.in))
			continue
		}
		must.NoError(t, err)
		tc.want.URI = tc.in
		must.Eq(t, tc.want, got)
	}
}

func TestEncodeSerial(t *testing.T) {
	must.EqOp(t, "0a:ff:01", encodeSerial([]byte{0x0a, 0xff, 0x01}))
	must.EqOp(t, "", encodeSerial(nil))
}
