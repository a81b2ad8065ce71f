package localstack

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/tlsfiles/pki"
)

// TestFederationTLSChainsToItsCA checks what `make up DCS=n` leaves in .oasis/federation-tls: per
// datacenter a routers' certificate naming it, valid for the loopback address peers dial, as
// server and as client, chaining to the CA beside it, and keys only their owner reads.
func TestFederationTLSChainsToItsCA(t *testing.T) {
	home := t.TempDir()
	certs, err := makeFederationTLS(home, []string{"dc1", "dc2"})
	must.NoError(t, err)

	dir := FederationTLSDir(home)
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	must.NoError(t, err)
	must.Eq(t, certs.CA, ca)
	roots := x509.NewCertPool()
	must.True(t, roots.AppendCertsFromPEM(ca))
	for _, dc := range []string{"dc1", "dc2"} {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "router-"+dc+".pem"), filepath.Join(dir, "router-"+dc+"-key.pem"))
		must.NoError(t, err)
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		must.NoError(t, err)
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			_, err := leaf.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}})
			must.NoError(t, err)
		}
		must.Len(t, 1, leaf.URIs)
		must.Eq(t, pki.RouterURI(dc).String(), leaf.URIs[0].String())
	}
	for _, name := range []string{"ca-key.pem", "router-dc1-key.pem", "router-dc2-key.pem"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		must.NoError(t, err)
		must.Eq(t, os.FileMode(0o600), fi.Mode().Perm(), must.Sprint(name))
	}
}
