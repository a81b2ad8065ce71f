package tlsfiles

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

// clock is a settable time for Config.now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// pairFiles writes a leaf's certificate and key into dir.
func pairFiles(t *testing.T, dir string, l *tlsfilestest.Leaf) (certFile, keyFile string) {
	return tlsfilestest.WriteFile(t, dir, "cert.pem", l.CertPEM), tlsfilestest.WriteFile(t, dir, "key.pem", l.KeyPEM)
}

func TestNewRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "ca")
	a, b := ca.Issue(t, "a", "127.0.0.1"), ca.Issue(t, "b", "127.0.0.1")
	certA := tlsfilestest.WriteFile(t, dir, "a.pem", a.CertPEM)
	keyA := tlsfilestest.WriteFile(t, dir, "a.key", a.KeyPEM)
	keyB := tlsfilestest.WriteFile(t, dir, "b.key", b.KeyPEM)
	junk := tlsfilestest.WriteFile(t, dir, "junk.pem", []byte("not PEM"))
	missing := dir + "/missing.pem"

	cases := []struct {
		name  string
		cfg   Config
		field string
		is    error
	}{
		{"nothing", Config{}, "", ErrNoFiles},
		{"key without certificate", Config{KeyFile: keyA}, "CertFile", nil},
		{"certificate without key", Config{CertFile: certA}, "KeyFile", nil},
		{"missing certificate", Config{CertFile: missing, KeyFile: keyA}, "CertFile", fs.ErrNotExist},
		{"missing key", Config{CertFile: certA, KeyFile: missing}, "KeyFile", fs.ErrNotExist},
		{"key of another certificate", Config{CertFile: certA, KeyFile: keyB}, "KeyFile", nil},
		{"certificate not PEM", Config{CertFile: junk, KeyFile: keyA}, "KeyFile", nil},
		{"missing CA bundle", Config{CertFile: certA, KeyFile: keyA, ClientCAFile: missing}, "ClientCAFile", fs.ErrNotExist},
		{"CA bundle not PEM", Config{ClientCAFile: junk}, "ClientCAFile", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			must.Error(t, err)
			if tc.is != nil {
				must.ErrorIs(t, err, tc.is)
			}
			if tc.field != "" {
				var fe *FileError
				must.True(t, errors.As(err, &fe), must.Sprint(err))
				must.Eq(t, tc.field, fe.Field)
			}
		})
	}
}

// serveTLS serves HTTP over TLS with cfg on loopback: /stream writes a line
// every 10 ms until the client goes, anything else answers "ok".
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stream" {
			io.WriteString(w, "ok")
			return
		}
		for {
			if _, err := io.WriteString(w, "tick\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})}
	go srv.Serve(tls.NewListener(ln, cfg))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// servedBy dials addr and returns the certificate the server presented.
func servedBy(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	must.NoError(t, err)
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

func counter(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "oasis_tls_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A changed pair is served to connections made after the next check (at
// most once per interval); a connection made before keeps working; bad new
// files keep the last good pair, counted and reported by Reload.
func TestReloadOnChange(t *testing.T) {
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "ca")
	certFile, keyFile := pairFiles(t, dir, ca.Issue(t, "first", "127.0.0.1"))
	clk := &clock{t: time.Now()}
	reg := prometheus.NewRegistry()
	f, err := New(Config{CertFile: certFile, KeyFile: keyFile, Registerer: reg, now: clk.now})
	must.NoError(t, err)
	addr := serveTLS(t, f.ServerConfig())
	client := &tls.Config{RootCAs: tlsfilestest.Pool(ca)}
	must.Eq(t, "first", servedBy(t, addr, client))

	// A stream opened before the rotation.
	tr := &http.Transport{TLSClientConfig: client}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/stream")
	must.NoError(t, err)
	defer resp.Body.Close()
	must.Eq(t, "first", resp.TLS.PeerCertificates[0].Subject.CommonName)
	lines := bufio.NewReader(resp.Body)

	pairFiles(t, dir, ca.Issue(t, "second", "127.0.0.1"))
	must.Eq(t, "first", servedBy(t, addr, client)) // no check due yet
	clk.advance(1100 * time.Millisecond)
	must.Eq(t, "second", servedBy(t, addr, client))
	must.Eq(t, 1.0, counter(t, reg, "ok"))
	for range 3 {
		line, err := lines.ReadString('\n')
		must.NoError(t, err)
		must.Eq(t, "tick\n", line)
	}

	// A certificate written before its key (a rotation under way) is no
	// failure: the last pair stays until the key arrives.
	third := ca.Issue(t, "third", "127.0.0.1")
	tlsfilestest.WriteFile(t, dir, "cert.pem", third.CertPEM)
	clk.advance(1100 * time.Millisecond)
	must.Eq(t, "second", servedBy(t, addr, client))
	tlsfilestest.WriteFile(t, dir, "key.pem", third.KeyPEM)
	clk.advance(1100 * time.Millisecond)
	must.Eq(t, "third", servedBy(t, addr, client))
	must.Eq(t, 0.0, counter(t, reg, "error"))
	must.Eq(t, 2.0, counter(t, reg, "ok"))

	// Files that stay bad keep the last good pair and count as one failure,
	// two intervals after they were first seen.
	tlsfilestest.WriteFile(t, dir, "cert.pem", []byte("-----BEGIN CERTIFICATE-----\ntrunc"))
	for range 4 {
		clk.advance(1100 * time.Millisecond)
		must.Eq(t, "third", servedBy(t, addr, client))
	}
	must.Eq(t, 1.0, counter(t, reg, "error"))
	must.NoError(t, f.Reload()) // reported, unchanged since: nothing to do

	fourth, other := ca.Issue(t, "fourth", "127.0.0.1"), ca.Issue(t, "other", "127.0.0.1")
	tlsfilestest.WriteFile(t, dir, "cert.pem", fourth.CertPEM)
	tlsfilestest.WriteFile(t, dir, "key.pem", other.KeyPEM)
	err = f.Reload()
	var fe *FileError
	must.True(t, errors.As(err, &fe), must.Sprint(err))
	must.Eq(t, "KeyFile", fe.Field)
	tlsfilestest.WriteFile(t, dir, "key.pem", fourth.KeyPEM)
	clk.advance(1100 * time.Millisecond)
	must.Eq(t, "fourth", servedBy(t, addr, client))
	must.Eq(t, 1.0, counter(t, reg, "error"))

	line, err := lines.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, "tick\n", line)
}

// With ClientCAFile the server requires a client certificate chaining to the
// bundle as it is now: a rotated bundle admits the new CA's clients and
// refuses the old one's.
func TestMutualTLSFollowsTheBundle(t *testing.T) {
	dir := t.TempDir()
	serverCA, oldCA, newCA := tlsfilestest.NewCA(t, "server-ca"), tlsfilestest.NewCA(t, "old"), tlsfilestest.NewCA(t, "new")
	certFile, keyFile := pairFiles(t, dir, serverCA.Issue(t, "server", "127.0.0.1"))
	caFile := tlsfilestest.WriteFile(t, dir, "clients.pem", oldCA.PEM)
	clk := &clock{t: time.Now()}
	f, err := New(Config{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile, now: clk.now})
	must.NoError(t, err)
	addr := serveTLS(t, f.ServerConfig())

	clientOf := func(ca *tlsfilestest.CA) *tls.Config {
		c := &tls.Config{RootCAs: tlsfilestest.Pool(serverCA)}
		if ca != nil {
			l := ca.Issue(t, "client", "client.test")
			pair, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
			must.NoError(t, err)
			c.Certificates = []tls.Certificate{pair}
		}
		return c
	}
	get := func(c *tls.Config) error {
		tr := &http.Transport{TLSClientConfig: c}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + addr + "/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	must.NoError(t, get(clientOf(oldCA)))
	must.Error(t, get(clientOf(nil)))
	must.Error(t, get(clientOf(newCA)))

	tlsfilestest.WriteFile(t, dir, "clients.pem", newCA.PEM)
	clk.advance(1100 * time.Millisecond)
	must.NoError(t, get(clientOf(newCA)))
	must.Error(t, get(clientOf(oldCA)))
}

func TestCertificateExpiryGauge(t *testing.T) {
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "ca")
	leaf := ca.Issue(t, "server", "127.0.0.1")
	certFile, keyFile := pairFiles(t, dir, leaf)
	reg := prometheus.NewRegistry()
	_, err := New(Config{CertFile: certFile, KeyFile: keyFile, Registerer: reg, Namespace: "oasis_test"})
	must.NoError(t, err)
	mfs, err := reg.Gather()
	must.NoError(t, err)
	var got *dto.Metric
	for _, mf := range mfs {
		if mf.GetName() == "oasis_test_tls_certificate_not_after_timestamp_seconds" {
			got = mf.GetMetric()[0]
		}
	}
	must.NotNil(t, got)
	must.Eq(t, float64(leaf.Cert.NotAfter.Unix()), got.GetGauge().GetValue())
}
