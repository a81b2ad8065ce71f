package peer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/prometheus/client_golang/prometheus"
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

// FilesIdentity is the node's identity from the PEM files, through the same
// meshid code path as a Consul Connect identity; the files are read again
// when they change (tlsfiles), so a renewed certificate needs no restart.
// reg (nil: none) gets oasis_tls_* and oasis_mesh_* metrics.
func FilesIdentity(f TLSFiles, reg prometheus.Registerer) (*meshid.Identity, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, errors.New("peer TLS needs a CA, a certificate and a key")
	}
	files, err := tlsfiles.New(tlsfiles.Config{CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: f.CA, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("loading peer TLS files: %w", err)
	}
	return meshid.New(context.Background(), meshid.Config{Files: files, Registerer: reg})
}

// IdentityTLS builds the configurations for serving and dialling from a
// meshid identity: TLS 1.3 and ALPN on top of meshid's verification. In the
// mesh a peer must be Connect service service, and callers are let in by
// intentions (Config.Authorize re-checks them on established connections);
// with files a peer's certificate must name f.ServerName, or with
// f.VerifyAddress the host it is dialled at.
func IdentityTLS(id *meshid.Identity, service string, f TLSFiles) (server, client *tls.Config) {
	server = id.ServerConfig(ALPN)
	// ServerConfig hands each handshake a clone of the configuration it
	// returned, so this setting reaches every handshake.
	server.MinVersion = tls.VersionTLS13
	client = id.ClientConfig(service, ALPN)
	client.MinVersion = tls.VersionTLS13
	switch {
	case id.Mesh():
		// The SPIFFE URI is verified, not the name; it is only SNI.
		client.ServerName = DefaultServerName
	case f.VerifyAddress:
		client.ServerName = "" // Node dials with each peer's host
	case f.ServerName != "":
		client.ServerName = f.ServerName
	default:
		client.ServerName = DefaultServerName
	}
	return server, client
}

// LoadTLS builds the mutual-TLS configurations for serving and dialling
// from the files (FilesIdentity and IdentityTLS).
func LoadTLS(f TLSFiles) (server, client *tls.Config, err error) {
	id, err := FilesIdentity(f, nil)
	if err != nil {
		return nil, nil, err
	}
	server, client = IdentityTLS(id, "", f)
	return server, client, nil
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
