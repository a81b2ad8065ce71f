// Package tlsfilestest makes throwaway certificate authorities and
// certificates for tests that run real TLS on loopback.
package tlsfilestest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/tlsfiles/pki"
)

// CA is a self-signed certificate authority.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
}

// Leaf is an issued certificate and its key, PEM-encoded.
type Leaf struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// Issue makes a certificate for the DNS names and IP addresses in names,
// usable by servers and clients alike.
func (ca *CA) Issue(t testing.TB, commonName string, names ...string) *Leaf {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &Leaf{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})}
}

// IssueRouter makes datacenter dc's routers' federation certificate, as
// pki.IssueRouter does (the datacenter in a URI SAN), for hosts.
func (ca *CA) IssueRouter(t testing.TB, dc string, hosts ...string) *Leaf {
	t.Helper()
	p, err := pki.ParseCA(ca.PEM, ca.keyPEM(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.IssueRouter(dc, hosts, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &Leaf{Cert: l.Cert, CertPEM: l.CertPEM, KeyPEM: l.KeyPEM}
}

// WriteRouterFiles issues IssueRouter's certificate for dc and hosts and
// writes ca.pem, <dc>.pem and <dc>-key.pem into dir, returning the paths.
func (ca *CA) WriteRouterFiles(t testing.TB, dir, dc string, hosts ...string) (caFile, certFile, keyFile string) {
	t.Helper()
	l := ca.IssueRouter(t, dc, hosts...)
	return WriteFile(t, dir, "ca.pem", ca.PEM), WriteFile(t, dir, dc+".pem", l.CertPEM),
		WriteFile(t, dir, dc+"-key.pem", l.KeyPEM)
}

func (ca *CA) keyPEM(t testing.TB) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// TLS is the leaf as a tls.Certificate, to serve or dial with.
func (l *Leaf) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteFiles issues a certificate for names (the first is its common name)
// and writes ca.pem, <name>.pem and <name>-key.pem into dir, returning the
// three paths.
func (ca *CA) WriteFiles(t testing.TB, dir, name string, names ...string) (caFile, certFile, keyFile string) {
	t.Helper()
	l := ca.Issue(t, names[0], names...)
	return WriteFile(t, dir, "ca.pem", ca.PEM), WriteFile(t, dir, name+".pem", l.CertPEM),
		WriteFile(t, dir, name+"-key.pem", l.KeyPEM)
}

// Pool is a certificate pool holding the CAs.
func Pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

// WriteFile writes data to dir/name atomically (a rename, as Nomad's
// template renderer does) and returns the path.
func WriteFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	tmp, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
