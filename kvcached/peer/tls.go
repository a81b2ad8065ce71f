package peer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ALPN is the application protocol peers negotiate; a connection without it
// is refused.
const ALPN = "oasis-kvcached/1"

// DefaultServerName is the DNS name every kvcached certificate carries and
// peers verify, so certificates need not name each node's address.
const DefaultServerName = "oasis-kvcached"

// TLSFiles names PEM files: the CA that signs every kvcached certificate and
// this node's certificate and key.
type TLSFiles struct {
	CA, Cert, Key string
	ServerName    string // verified on peers' certificates; DefaultServerName if empty
	// VerifyAddress makes each peer's certificate name the node: it must
	// carry the host the peer is dialled at (IP or DNS SAN) instead of the
	// one shared ServerName, so a node cannot pose as another.
	VerifyAddress bool
}

// LoadTLS builds the mutual-TLS configurations for serving and dialling.
func LoadTLS(f TLSFiles) (server, client *tls.Config, err error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, nil, errors.New("peer TLS needs a CA, a certificate and a key")
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, nil, fmt.Errorf("reading peer CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("reading peer CA %s: no PEM certificates", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("loading peer certificate: %w", err)
	}
	server, client, err = TLSConfigs(pool, cert, f.ServerName)
	if err == nil && f.VerifyAddress {
		client.ServerName = "" // Node dials with each peer's host
	}
	return server, client, err
}

// TLSConfigs builds the configurations from parsed material.
func TLSConfigs(ca *x509.CertPool, cert tls.Certificate, serverName string) (server, client *tls.Config, err error) {
	if serverName == "" {
		serverName = DefaultServerName
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		NextProtos:   []string{ALPN},
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      ca,
		ServerName:   serverName,
		NextProtos:   []string{ALPN},
	}
	return server, client, nil
}
