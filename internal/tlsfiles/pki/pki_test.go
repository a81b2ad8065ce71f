package pki

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// A router certificate chains to its CA, names the hosts given and carries
// its datacenter's URI SAN; a CA read back issues certificates that chain
// to it too.
func TestIssueRouter(t *testing.T) {
	ca, err := NewCA("test federation CA", time.Hour)
	must.NoError(t, err)
	again, err := ParseCA(ca.CertPEM, ca.KeyPEM())
	must.NoError(t, err)
	for _, c := range []*CA{ca, again} {
		l, err := c.IssueRouter("dc-east.1", []string{"10.0.0.5", "router.example"}, time.Hour)
		must.NoError(t, err)
		pair, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
		must.NoError(t, err)
		roots := x509.NewCertPool()
		roots.AddCert(ca.Cert)
		for _, host := range []string{"10.0.0.5", "router.example"} {
			_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			must.NoError(t, err)
		}
		must.SliceLen(t, 1, pair.Leaf.URIs)
		must.EqOp(t, "spiffe://oasis/ns/default/dc/dc-east.1/svc/oasis-router", pair.Leaf.URIs[0].String())
	}
	_, err = ca.IssueRouter("", nil, time.Hour)
	must.Error(t, err)
	other, err := NewCA("other", time.Hour)
	must.NoError(t, err)
	_, err = ParseCA(ca.CertPEM, other.KeyPEM())
	must.Error(t, err)
}
