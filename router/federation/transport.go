package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/internal/tlsfiles/pki"
)

// Identity is this router's TLS identity on the federation link. Server
// returns a configuration that requires and verifies client certificates
// (tls.RequireAndVerifyClientCert); Client one that presents this router's
// certificate and verifies the peer's. Both are called once, when the
// federation starts, and may follow rotating material themselves
// (GetCertificate, GetConfigForClient): a Consul Connect leaf and its roots,
// or PEM files, both through internal/meshid (MeshIdentity, FilesIdentity).
type Identity struct {
	Server func() *tls.Config
	Client func() *tls.Config
	// Authorize, when set, is asked about every request the listener
	// serves (403 when it refuses): in the mesh, the intentions as they
	// are now, so that a revoked one stops connections made before it.
	Authorize func(tls.ConnectionState) error
	// PeerDC is the datacenter a peer's certificate names, "" for none (a
	// Connect leaf's SPIFFE ID; with files a URI SAN of the same form). A
	// peer must be of the datacenter it speaks for: a dial of an address
	// registered for dc2 fails at the handshake unless the certificate there
	// is dc2's, and the listener serves a caller only when its certificate
	// names a datacenter whose routers Consul lists (summaries only for that
	// datacenter). Anyone who may register a service cannot send one
	// datacenter's traffic to another's router, and a certificate of the CA
	// cannot speak for a datacenter it does not name. Required.
	PeerDC func(tls.ConnectionState) string
}

// ErrNoClientAuth is a server configuration that would accept clients
// without a certificate: every peer must be authenticated.
var ErrNoClientAuth = errors.New("federation: the identity's server configuration does not require client certificates")

// MeshIdentity is the federation identity of id: in the Consul mesh, peers
// must present a leaf of peerService and the intentions decide (at the
// handshake and per request); from files, a certificate the CA signed. Either
// way a peer's certificate must name its datacenter (PeerDC): the Connect
// leaf's SPIFFE ID, or with files a URI SAN of the same form naming service
// pki.RouterService (pki.RouterURI; pki.IssueRouter makes such certificates).
func MeshIdentity(id *meshid.Identity, peerService string) Identity {
	ident := Identity{
		Server:    func() *tls.Config { return id.ServerConfig() },
		Client:    func() *tls.Config { return id.ClientConfig(peerService) },
		Authorize: id.Authorize,
		PeerDC:    meshid.PeerDatacenter,
	}
	if !id.Mesh() {
		ident.PeerDC = filesPeerDC
	}
	return ident
}

// filesPeerDC is the datacenter a PEM certificate names: its URI SAN
// spiffe://<any>/ns/<ns>/dc/<dc>/svc/oasis-router ("" for any other).
func filesPeerDC(cs tls.ConnectionState) string {
	if meshid.PeerService(cs) != pki.RouterService {
		return ""
	}
	if dc := meshid.PeerDatacenter(cs); validName(dc) {
		return dc
	}
	return ""
}

// CertificateDC is the datacenter a router's own PEM certificate names for
// its peers ("" for none), as they will read it.
func CertificateDC(c *tls.Certificate) string {
	if c == nil || c.Leaf == nil {
		return ""
	}
	return filesPeerDC(tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.Leaf}})
}

// ErrWrongDC is a peer whose certificate is of another datacenter than the
// one it was found for.
var ErrWrongDC = errors.New("federation: the peer's certificate is of another datacenter")

// dcChecked refuses answers from a peer whose certificate names another
// datacenter than the one its address was registered for.
type dcChecked struct {
	rt http.RoundTripper
	f  *Federation
}

func (d dcChecked) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.rt.RoundTrip(req)
	if err != nil || resp.TLS == nil {
		return resp, err
	}
	want := d.f.peerDC(req.URL.Host)
	if got := d.f.cfg.Identity.PeerDC(*resp.TLS); want != "" && got != want {
		_ = resp.Body.Close()
		d.f.m.wrongDC.WithLabelValues(want).Inc()
		return nil, fmt.Errorf("%w: %s was found for %s, its certificate is %s's", ErrWrongDC, req.URL.Host, want, got)
	}
	return resp, nil
}

// FilesIdentity is the identity in PEM files reloaded by tlsfiles, through
// meshid like the mesh's; f must name a certificate, its key and the CA
// bundle peers chain to.
func FilesIdentity(f *tlsfiles.Files) (Identity, error) {
	id, err := meshid.New(context.Background(), meshid.Config{Files: f})
	if err != nil {
		return Identity{}, err
	}
	return MeshIdentity(id, ""), nil
}

// QUIC timers: a peer that goes silent is noticed within MaxIdleTimeout
// instead of quic-go's default 30 s, which would hold a cut stream open.
// A connection carries at most quicMaxStreams requests at once.
const (
	quicKeepAlive   = time.Second
	quicIdleTimeout = 5 * time.Second
	quicMaxStreams  = 256
)

func quicConfig() *quic.Config {
	return &quic.Config{KeepAlivePeriod: quicKeepAlive, MaxIdleTimeout: quicIdleTimeout}
}

// quicServerConfig is the listener's: quicConfig, and the streams a peer
// may open on one connection.
func quicServerConfig() *quic.Config {
	c := quicConfig()
	c.MaxIncomingStreams = quicMaxStreams
	return c
}

// serverTLS returns the identity's server configuration for HTTP/3, TLS 1.3
// only, refusing any configuration that does not require client certificates.
func (id Identity) serverTLS() (*tls.Config, error) {
	c := id.Server()
	if c.ClientAuth != tls.RequireAndVerifyClientCert {
		return nil, ErrNoClientAuth
	}
	c = c.Clone()
	c.MinVersion = tls.VersionTLS13
	return http3.ConfigureTLSConfig(c), nil
}

// ErrUnknownPeer is a dial to an address that no known peer has.
var ErrUnknownPeer = errors.New("federation: not the address of a known peer")

// dialTLS is the client configuration for one dial of addr (host:port): the
// server's certificate must name the dialled host (meshid.ForHost: crypto/tls
// reports no name for an IP address, which would check none) and the
// datacenter addr was found for.
func (f *Federation) dialTLS(base *tls.Config, addr string) (*tls.Config, error) {
	want := f.peerDC(addr)
	if want == "" {
		return nil, fmt.Errorf("%w: %s", ErrUnknownPeer, addr)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	c := meshid.ForHost(base, host)
	c.MinVersion = tls.VersionTLS13
	verify := c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		if got := f.cfg.Identity.PeerDC(cs); got != want {
			f.m.wrongDC.WithLabelValues(want).Inc()
			return fmt.Errorf("%w: %s was found for %s, its certificate names %q", ErrWrongDC, addr, want, got)
		}
		return nil
	}
	return c, nil
}

// h3Client is the HTTP/3 client: its dials are dialTLS's, on its own UDP
// socket. An http3.Transport keeps one connection per peer address.
type h3Client struct {
	*http3.Transport
	qt *quic.Transport
}

func (f *Federation) newH3Client() (*h3Client, error) {
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, fmt.Errorf("federation: client socket: %w", err)
	}
	c := &h3Client{qt: &quic.Transport{Conn: udp}}
	base := f.cfg.Identity.Client()
	c.Transport = &http3.Transport{TLSClientConfig: base, QUICConfig: quicConfig(), DisableCompression: true,
		Dial: func(ctx context.Context, addr string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			dc, err := f.dialTLS(tc, addr)
			if err != nil {
				return nil, err
			}
			ua, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				return nil, err
			}
			return c.qt.Dial(ctx, ua, dc, qc)
		}}
	return c, nil
}

func (c *h3Client) Close() error {
	err := c.Transport.Close()
	_ = c.qt.Close()
	_ = c.qt.Conn.Close()
	return err
}

// newH2Client is the HTTP/2 over TLS client (Config.HTTP2): dialTLS's
// dials, at most MaxConnsPerPeer connections per peer.
func (f *Federation) newH2Client() *http.Transport {
	base := f.cfg.Identity.Client()
	return &http.Transport{ForceAttemptHTTP2: true, DisableCompression: true, MaxConnsPerHost: f.cfg.MaxConnsPerPeer,
		MaxIdleConnsPerHost: f.cfg.MaxConnsPerPeer, IdleConnTimeout: 90 * time.Second,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := f.dialTLS(base, addr)
			if err != nil {
				return nil, err
			}
			c.NextProtos = []string{"h2"}
			d := tls.Dialer{Config: c}
			return d.DialContext(ctx, network, addr)
		}}
}
