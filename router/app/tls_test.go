package app

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

// testPKI is a server certificate for 127.0.0.1 from serverCA, and client
// certificates from clientCA (trusted with -tls-client-ca) and from another
// CA (not trusted).
type testPKI struct {
	dir                   string
	serverCA, clientCA    *tlsfilestest.CA
	serverCert, serverKey string
	clientCAFile          string
	clientKey             string // the trusted client's key file
	client, stranger      tls.Certificate
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), serverCA: tlsfilestest.NewCA(t, "server CA"), clientCA: tlsfilestest.NewCA(t, "client CA")}
	p.writeServer(t, "first")
	p.clientCAFile = tlsfilestest.WriteFile(t, p.dir, "client-ca.pem", p.clientCA.PEM)
	leaf := p.clientCA.Issue(t, "client", "client.test")
	p.clientKey = tlsfilestest.WriteFile(t, p.dir, "client.key", leaf.KeyPEM)
	p.client = pair(t, leaf)
	p.stranger = pair(t, tlsfilestest.NewCA(t, "stranger CA").Issue(t, "stranger", "stranger.test"))
	return p
}

// writeServer (re)writes the server's certificate and key, named cn.
func (p *testPKI) writeServer(t *testing.T, cn string) {
	leaf := p.serverCA.Issue(t, cn, "127.0.0.1")
	p.serverCert = tlsfilestest.WriteFile(t, p.dir, "server.pem", leaf.CertPEM)
	p.serverKey = tlsfilestest.WriteFile(t, p.dir, "server.key", leaf.KeyPEM)
}

func pair(t *testing.T, l *tlsfilestest.Leaf) tls.Certificate {
	c, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	must.NoError(t, err)
	return c
}

// client returns an HTTP client trusting the server CA, presenting certs,
// speaking HTTP/2 when h2 (by ALPN) and HTTP/1.1 only otherwise.
func (p *testPKI) httpClient(t *testing.T, h2 bool, certs ...tls.Certificate) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlsfilestest.Pool(p.serverCA), Certificates: certs}}
	var protos http.Protocols
	protos.SetHTTP1(!h2)
	protos.SetHTTP2(h2)
	tr.Protocols = &protos
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func tlsConfig(t *testing.T, p *testPKI, engines ...string) Config {
	cfg := baseConfig(t, engines...)
	cfg.TLSCert, cfg.TLSKey = p.serverCert, p.serverKey
	return cfg
}

// HTTPS serves HTTP/1.1 and, by ALPN, HTTP/2, whose streams are passed
// through event by event.
func TestHTTPSAndHTTP2(t *testing.T) {
	const events, gap = 5, 100 * time.Millisecond
	eng := newEngine(t, events, gap)
	p := newPKI(t)
	r := start(t, tlsConfig(t, p, eng.URL))

	resp := complete(t, p.httpClient(t, false), r.url("https"), false)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, 1, resp.ProtoMajor)
	must.NotNil(t, resp.TLS)

	h2 := p.httpClient(t, true)
	resp = complete(t, h2, r.url("https"), false)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, 2, resp.ProtoMajor)
	b, _ := io.ReadAll(resp.Body)
	must.StrContains(t, string(b), `"text":"hello"`)

	began := time.Now()
	resp = complete(t, h2, r.url("https"), true)
	must.Eq(t, 2, resp.ProtoMajor)
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	must.NoError(t, err)
	// The first event arrives while the engine is still streaming.
	must.Less(t, gap*events/2, time.Since(began))
	must.Eq(t, wantEvents(events), append([]string{strings.TrimSpace(first)}, readEvents(t, br)...))
}

// Unencrypted HTTP/2 (h2c with prior knowledge) is not spoken: the
// connection preface is answered as a malformed HTTP/1.1 request.
func TestH2CPriorKnowledgeRefused(t *testing.T) {
	r := start(t, baseConfig(t, newEngine(t, 1, 0).URL))
	c, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	must.NoError(t, err)
	head := make([]byte, 9)
	_, err = io.ReadFull(c, head)
	must.NoError(t, err)
	must.Eq(t, "HTTP/1.1 ", string(head)) // not an HTTP/2 SETTINGS frame

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(r.url("http") + "/health")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("h2c request answered: %s %s", resp.Proto, resp.Status)
	}
}

func TestTLSBelow12Refused(t *testing.T) {
	p := newPKI(t)
	r := start(t, tlsConfig(t, p, newEngine(t, 1, 0).URL))
	for _, v := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
		c, err := tls.Dial("tcp", r.Addr().String(), &tls.Config{RootCAs: tlsfilestest.Pool(p.serverCA), MinVersion: v, MaxVersion: v})
		if err == nil {
			c.Close()
		}
		must.ErrorContains(t, err, "protocol version")
	}
	c, err := tls.Dial("tcp", r.Addr().String(), &tls.Config{RootCAs: tlsfilestest.Pool(p.serverCA), MaxVersion: tls.VersionTLS12})
	must.NoError(t, err)
	c.Close()
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	cfg := tlsConfig(t, p, newEngine(t, 1, 0).URL)
	cfg.TLSClientCA = p.clientCAFile
	r := start(t, cfg)

	for name, c := range map[string]*http.Client{
		"no client certificate":   p.httpClient(t, false),
		"certificate of other CA": p.httpClient(t, false, p.stranger),
		"no certificate over h2":  p.httpClient(t, true),
	} {
		_, err := c.Get(r.url("https") + "/health")
		must.Error(t, err, must.Sprint(name))
	}
	for _, h2 := range []bool{false, true} {
		resp := complete(t, p.httpClient(t, h2, p.client), r.url("https"), false)
		must.Eq(t, http.StatusOK, resp.StatusCode)
		must.Eq(t, map[bool]int{false: 1, true: 2}[h2], resp.ProtoMajor)
	}
}

// A new certificate is served to new connections without a restart, and a
// stream open on the old one goes on to its end.
func TestCertificateRotationKeepsStreams(t *testing.T) {
	const events = 30
	eng := newEngine(t, events, 50*time.Millisecond)
	p := newPKI(t)
	r := start(t, tlsConfig(t, p, eng.URL))

	resp := complete(t, p.httpClient(t, true), r.url("https"), true)
	must.Eq(t, "first", resp.TLS.PeerCertificates[0].Subject.CommonName)
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	must.NoError(t, err)

	p.writeServer(t, "second")
	testutil.Eventually(t, 10*time.Second, "new connections to see the rotated certificate", func() bool {
		c, err := tls.Dial("tcp", r.Addr().String(), &tls.Config{RootCAs: tlsfilestest.Pool(p.serverCA)})
		if err != nil {
			return false
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName == "second"
	})
	fresh := complete(t, p.httpClient(t, true), r.url("https"), false)
	must.Eq(t, http.StatusOK, fresh.StatusCode)
	must.Eq(t, "second", fresh.TLS.PeerCertificates[0].Subject.CommonName)

	must.Eq(t, wantEvents(events), append([]string{strings.TrimSpace(first)}, readEvents(t, br)...))
}
