package localstack

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oasis-llm/oasis/internal/tlsfiles/pki"
)

// FederationTLSDir is where `make up DCS=n` keeps the federation's certificates: the CA it makes
// at up (ca.pem, ca-key.pem) and each datacenter's routers' certificate issued from it
// (router-<dc>.pem, router-<dc>-key.pem). Down removes them with the rest of home.
func FederationTLSDir(home string) string { return filepath.Join(home, "federation-tls") }

// federationValidity is how long the CA and the routers' certificates are valid: longer than a
// local stack stays up.
const federationValidity = 365 * 24 * time.Hour

// federationHosts are where peers dial a router of the local stack (its registered address).
var federationHosts = []string{"127.0.0.1", "localhost"}

// federationTLS is what a router's federation listener needs, PEM-encoded: the CA peers'
// certificates must chain to and, per datacenter, the certificate and key its routers show peers
// as server and client (naming that datacenter: pki.RouterURI).
type federationTLS struct {
	CA        []byte
	Cert, Key map[string][]byte
}

// pemFile is a file makeFederationTLS writes.
type pemFile struct {
	name string
	data []byte
	mode os.FileMode
}

// makeFederationTLS makes a CA and issues from it one certificate for each datacenter's routers,
// writes them under FederationTLSDir(home) (keys readable by the owner only) and returns them.
func makeFederationTLS(home string, dcs []string) (*federationTLS, error) {
	ca, err := pki.NewCA("oasis local federation CA", federationValidity)
	if err != nil {
		return nil, fmt.Errorf("making the federation CA: %w", err)
	}
	dir := FederationTLSDir(home)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	t := &federationTLS{CA: ca.CertPEM, Cert: map[string][]byte{}, Key: map[string][]byte{}}
	files := []pemFile{{"ca.pem", ca.CertPEM, 0o644}, {"ca-key.pem", ca.KeyPEM(), 0o600}}
	for _, dc := range dcs {
		leaf, err := ca.IssueRouter(dc, federationHosts, federationValidity)
		if err != nil {
			return nil, fmt.Errorf("issuing %s's routers' federation certificate: %w", dc, err)
		}
		t.Cert[dc], t.Key[dc] = leaf.CertPEM, leaf.KeyPEM
		files = append(files, pemFile{"router-" + dc + ".pem", leaf.CertPEM, 0o644},
			pemFile{"router-" + dc + "-key.pem", leaf.KeyPEM, 0o600})
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return nil, fmt.Errorf("writing the federation certificates: %w", err)
		}
	}
	return t, nil
}
