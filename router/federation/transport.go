package federation

import (
	"context"
	"crypto/tls"
	"errors"
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
}

// ErrNoClientAuth is a server configuration that would accept clients
// without a certificate: every peer must be authenticated.
var ErrNoClientAuth = errors.New("federation: the identity's server configuration does not require client certificates")

// MeshIdentity is the federation identity of id: in the Consul mesh, peers
// must present a leaf of peerService and the intentions decide (at the
// handshake and per request); from files, any certificate the CA signed.
func MeshIdentity(id *meshid.Identity, peerService string) Identity {
	return Identity{
		Server:    func() *tls.Config { return id.ServerConfig() },
		Client:    func() *tls.Config { return id.ClientConfig(peerService) },
		Authorize: id.Authorize,
	}
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
