package meshid

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ServerConfig returns a TLS 1.2+ server configuration that presents the
// current certificate, requires a client certificate chaining to the current
// roots and, in the mesh, lets in only callers whose service intentions
// allow. nextProtos are the ALPN protocols to offer ("h2", "http/1.1", or
// http3.NextProtoH3): each handshake gets a copy of this configuration
// (GetConfigForClient, for the roots of the moment), so protocols a server
// adds to its own copy later are not seen. Session tickets are off: a
// resumed session would skip the caller's verification.
func (id *Identity) ServerConfig(nextProtos ...string) *tls.Config {
	base := &tls.Config{
		MinVersion:             tls.VersionTLS12,
		NextProtos:             nextProtos,
		SessionTicketsDisabled: true,
		ClientAuth:             tls.RequireAndVerifyClientCert,
		GetCertificate:         func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return id.certificate(), nil },
		VerifyConnection:       id.verifyClient,
	}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = id.roots()
		return c, nil
	}
	return base
}

// ClientConfig returns a TLS 1.2+ client configuration that presents the
// current certificate and accepts a server only if its chain ends in the
// current roots and, in the mesh, its certificate names service (any
// datacenter of the trust domain; "" accepts any service). With files the
// server's name is checked against ServerName instead, as crypto/tls would;
// a dial by IP address needs ForHost (crypto/tls leaves addresses out of
// the name a handshake reports, and such a handshake is refused).
func (id *Identity) ClientConfig(service string, nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		// Verification is VerifyConnection's, against the roots as they are
		// at each handshake (RootCAs is fixed for a configuration's life).
		InsecureSkipVerify:   true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return id.certificate(), nil },
		VerifyConnection:     func(cs tls.ConnectionState) error { return id.verifyServer(cs, service) },
	}
}

// ErrNoServerName is a files identity's handshake with no server name to
// check: a peer dialled by IP address through a configuration that is not
// ForHost's.
var ErrNoServerName = errors.New("meshid: no server name to verify (dialled by IP address: use meshid.ForHost with the dialled host)")

// ForHost is c (a ClientConfig) for one dial of host, an IP address or a DNS
// name: its ServerName is host and its VerifyConnection checks the server's
// certificate against host. crypto/tls leaves an IP address out of
// ConnectionState.ServerName, so without it a files identity would have no
// name to check a peer dialled by address against (it refuses instead:
// ErrNoServerName). A ServerName already set in c is the name checked.
func ForHost(c *tls.Config, host string) *tls.Config {
	c = c.Clone()
	if c.ServerName == "" {
		c.ServerName = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	name := c.ServerName
	if verify := c.VerifyConnection; verify != nil && name != "" {
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if cs.ServerName == "" {
				cs.ServerName = name
			}
			return verify(cs)
		}
	}
	return c
}

// Authorize checks a connection's caller against the intentions as they
// are now, as the handshake did (files: any certificate the CA signed).
// Servers call it per request, so a revoked intention stops connections
// made before it too; decisions are cached per certificate serial.
func (id *Identity) Authorize(cs tls.ConnectionState) error { return id.verifyClient(cs) }

// verifyClient runs after crypto/tls verified the caller's chain against the
// roots: it checks the caller's SPIFFE identity and asks the intentions.
func (id *Identity) verifyClient(cs tls.ConnectionState) error {
	if id.files != nil {
		return nil // every certificate the CA signed
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("meshid: the caller presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	sid, err := id.peerID(leaf)
	if err != nil {
		return err
	}
	return id.authz.authorize(sid.URI, encodeSerial(leaf.SerialNumber.Bytes()))
}

// verifyServer checks a server's chain against the current roots, then its
// name: the service in its SPIFFE URI in the mesh, the DNS name otherwise.
func (id *Identity) verifyServer(cs tls.ConnectionState, service string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("meshid: the server presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	opts := x509.VerifyOptions{Roots: id.roots(), Intermediates: x509.NewCertPool()}
	for _, ic := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	if id.files != nil {
		opts.DNSName = cs.ServerName
	}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("meshid: server certificate: %w", err)
	}
	if id.files != nil {
		if cs.ServerName == "" {
			// crypto/tls leaves an IP address out of ServerName (SNI carries
			// no addresses): verifying "" would check no name at all.
			return ErrNoServerName
		}
		return nil
	}
	sid, err := id.peerID(leaf)
	if err != nil {
		return err
	}
	if service != "" && sid.Service != service {
		return fmt.Errorf("meshid: the server is %s, not service %q", sid.URI, service)
	}
	return nil
}

// peerID is a mesh peer's SPIFFE identity, which must be in this trust domain.
func (id *Identity) peerID(c *x509.Certificate) (SpiffeID, error) {
	if len(c.URIs) != 1 {
		return SpiffeID{}, fmt.Errorf("meshid: the certificate has %d URI names, want 1 SPIFFE ID", len(c.URIs))
	}
	sid, err := ParseSpiffeID(c.URIs[0].String())
	if err != nil {
		return SpiffeID{}, err
	}
	if td := id.TrustDomain(); !strings.EqualFold(sid.TrustDomain, td) {
		return SpiffeID{}, fmt.Errorf("meshid: %s is not of trust domain %s", sid.URI, td)
	}
	return sid, nil
}

// SpiffeID is a Connect service identity,
// spiffe://<trust-domain>/ns/<namespace>/dc/<datacenter>/svc/<service>
// (Consul Enterprise adds /ap/<partition> before /ns).
type SpiffeID struct {
	URI                                         string
	TrustDomain, Namespace, Datacenter, Service string
}

// ErrNotSpiffe: a URI that is not a Connect service identity.
var ErrNotSpiffe = errors.New("meshid: not a Connect service SPIFFE ID")

// ParseSpiffeID parses a Connect service identity.
func ParseSpiffeID(uri string) (SpiffeID, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "spiffe" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return SpiffeID{}, fmt.Errorf("%w: %q", ErrNotSpiffe, uri)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts)%2 != 0 {
		return SpiffeID{}, fmt.Errorf("%w: %q", ErrNotSpiffe, uri)
	}
	sid := SpiffeID{URI: uri, TrustDomain: u.Host}
	for i := 0; i < len(parts); i += 2 {
		k, v := parts[i], parts[i+1]
		if v == "" {
			return SpiffeID{}, fmt.Errorf("%w: %q", ErrNotSpiffe, uri)
		}
		switch k {
		case "ap":
		case "ns":
			sid.Namespace = v
		case "dc":
			sid.Datacenter = v
		case "svc":
			sid.Service = v
		default:
			return SpiffeID{}, fmt.Errorf("%w: %q", ErrNotSpiffe, uri)
		}
	}
	if sid.Namespace == "" || sid.Datacenter == "" || sid.Service == "" {
		return SpiffeID{}, fmt.Errorf("%w: %q", ErrNotSpiffe, uri)
	}
	return sid, nil
}

// PeerService is the mesh service of a connection's peer, "" when the peer
// has no Connect identity (files, or no certificate).
func PeerService(cs tls.ConnectionState) string { return peerSpiffe(cs).Service }

// peerSpiffe is a connection's peer's Connect identity, zero when it has none.
func peerSpiffe(cs tls.ConnectionState) SpiffeID {
	if len(cs.PeerCertificates) == 0 || len(cs.PeerCertificates[0].URIs) != 1 {
		return SpiffeID{}
	}
	sid, _ := ParseSpiffeID(cs.PeerCertificates[0].URIs[0].String())
	return sid
}

// PeerDatacenter is the datacenter in a connection's peer's Connect
// identity, "" when the peer has none.
func PeerDatacenter(cs tls.ConnectionState) string { return peerSpiffe(cs).Datacenter }

// encodeSerial writes a serial number as Consul does: lowercase hex bytes
// joined by colons.
func encodeSerial(b []byte) string {
	const hexDigits = "0123456789abcdef"
	var sb strings.Builder
	for i, c := range b {
		if i > 0 {
			sb.WriteByte(':')
		}
		sb.WriteByte(hexDigits[c>>4])
		sb.WriteByte(hexDigits[c&0xf])
	}
	return sb.String()
}
