package federation

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
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
	// PeerDC, when set, is the datacenter a peer's certificate names (a
	// Connect leaf's SPIFFE ID does; files do not). A peer must then be of
	// the datacenter it speaks for: a request to an address registered for
	// dc2 fails unless the certificate there is dc2's, and a summary is
	// taken only for the caller's own datacenter. Anyone who may register a
	// service cannot send one datacenter's traffic to another's router.
	PeerDC func(tls.ConnectionState) string
}

// ErrNoClientAuth is a server configuration that would accept clients
// without a certificate: every peer must be authenticated.
var ErrNoClientAuth = errors.New("federation: the identity's server configuration does not require client certificates")

// MeshIdentity is the federation identity of id: in the Consul mesh, peers
// must present a leaf of peerService and the intentions decide (at the
// handshake and per request); from files, any certificate the CA signed.
func MeshIdentity(id *meshid.Identity, peerService string) Identity {
	ident := Identity{
		Server:    func() *tls.Config { return id.ServerConfig() },
		Client:    func() *tls.Config { return id.ClientConfig(peerService) },
		Authorize: id.Authorize,
	}
	if id.Mesh() {
		ident.PeerDC = meshid.PeerDatacenter
	}
	return ident
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
const (
	quicKeepAlive   = time.Second
	quicIdleTimeout = 5 * time.Second
)

func quicConfig() *quic.Config {
	return &quic.Config{KeepAlivePeriod: quicKeepAlive, MaxIdleTimeout: quicIdleTimeout}
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

// clientTransport is an HTTP/3 client with the identity.
func (id Identity) clientTransport() *http3.Transport {
	c := id.Client().Clone()
	c.MinVersion = tls.VersionTLS13
	return &http3.Transport{TLSClientConfig: c, QUICConfig: quicConfig(), DisableCompression: true}
}
