package localstack

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// FederationTLSDir is where `make up DCS=n` keeps the federation's certificates: the CA it makes
// at up (ca.pem, ca-key.pem) and the routers' certificate it issues from it (router.pem,
// router-key.pem). Down removes them with the rest of home.
func FederationTLSDir(home string) string { return filepath.Join(home, "federation-tls") }

// federationValidity is how long the CA and the routers' certificate are valid: longer than a
// local stack stays up.
const federationValidity = 365 * 24 * time.Hour

// federationTLS is what a router's federation listener needs, PEM-encoded: its certificate and
// key, shown to peers as server and client, and the CA peers' certificates must chain to.
type federationTLS struct {
	CA, Cert, Key []byte
}

// makeFederationTLS makes a CA and issues one certificate from it for every datacenter's routers,
// valid for the address peers dial (the registered address, loopback here) and for server and
// client use, writes them under FederationTLSDir(home) (keys readable by the owner only) and
// returns them.
func makeFederationTLS(home string) (*federationTLS, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caSerial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: caSerial, Subject: pkix.Name{CommonName: "oasis local federation CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(federationValidity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("making the federation CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "oasis-router-federation"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(federationValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("issuing the routers' federation certificate: %w", err)
	}
	caKeyDER, err := x509.MarshalPKCS8PrivateKey(caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	t := &federationTLS{
		CA:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}

	dir := FederationTLSDir(home)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"ca.pem", t.CA, 0o644},
		{"ca-key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKeyDER}), 0o600},
		{"router.pem", t.Cert, 0o644},
		{"router-key.pem", t.Key, 0o600},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return nil, fmt.Errorf("writing the federation certificates: %w", err)
		}
	}
	return t, nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}
