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
	return TLSConfigs(pool, cert, f.ServerName)
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
