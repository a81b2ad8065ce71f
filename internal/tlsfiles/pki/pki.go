// Package pki makes certificate authorities and certificates for Oasis's
// PEM-file identities: the one place that knows what a certificate must
// carry. Tests (tlsfilestest) and local stacks (`make up`) issue through it,
// so they make what the router and kvcached verify.
//
// A router's federation certificate names its datacenter in a URI SAN of the
// same form as a Consul Connect leaf's SPIFFE ID (RouterURI):
//
//	spiffe://oasis/ns/default/dc/<dc>/svc/oasis-router
//
// plus the DNS names and IP addresses peers dial it at. A router takes a
// datacenter's summaries and forwarded requests only from a peer whose
// certificate names that datacenter (router/federation).
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// The SPIFFE form of a files identity.
const (
	// TrustDomain is the trust domain RouterURI writes. Verifiers do not
	// check it with files: the CA bundle is the trust boundary.
	TrustDomain = "oasis"
	// RouterService is the service a router's certificate names.
	RouterService = "oasis-router"
)

// RouterURI is the URI SAN naming a router of datacenter dc.
func RouterURI(dc string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/ns/default/dc/" + dc + "/svc/" + RouterService}
}

// CA is a certificate authority whose key is in memory.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA named commonName, valid from an hour ago for
// validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: making CA %q: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// ParseCA reads a CA NewCA made (its certificate and KeyPEM), to issue
// more certificates from it later.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("pki: CA certificate or key is not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("pki: the CA key is not the certificate's ECDSA key")
	}
	return &CA{Cert: cert, CertPEM: certPEM, key: key}, nil
}

// KeyPEM is the CA's private key, PKCS #8 in PEM.
func (ca *CA) KeyPEM() []byte {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		panic(err) // an ECDSA P-256 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// Spec is a certificate to issue.
type Spec struct {
	CommonName string
	Hosts      []string   // DNS names and IP addresses (IP SANs when they parse as one)
	URIs       []*url.URL // URI SANs
	Validity   time.Duration
}

// Leaf is an issued certificate and its key, PEM-encoded.
type Leaf struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// Issue makes a certificate usable by servers and clients alike.
func (ca *CA) Issue(s Spec) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: s.CommonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(s.Validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        s.URIs,
	}
	for _, h := range s.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("pki: issuing %q: %w", s.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Leaf{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})}, nil
}

// IssueRouter makes datacenter dc's routers' federation certificate: its
// RouterURI and the hosts peers dial (every router of dc may share it).
func (ca *CA) IssueRouter(dc string, hosts []string, validity time.Duration) (*Leaf, error) {
	if dc == "" {
		return nil, errors.New("pki: a router certificate needs its datacenter")
	}
	return ca.Issue(Spec{CommonName: RouterService + "." + dc, Hosts: hosts, URIs: []*url.URL{RouterURI(dc)}, Validity: validity})
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}
