// Package meshid is a service's mutual-TLS identity, from Consul's service
// mesh (Connect) or from PEM files, behind one pair of tls.Configs.
//
// With Consul, the identity is the service's Connect leaf certificate and the
// mesh's CA roots, each followed with blocking queries on the local agent
// (GET /v1/agent/connect/ca/leaf/<service>, /v1/agent/connect/ca/roots), so a
// rotation or a new root reaches the next handshake without a restart while
// established connections keep the certificate they were made with. Peers are
// verified as Consul's own Connect-native library does: the chain against the
// current roots, then the SPIFFE URI of the leaf
// (spiffe://<trust-domain>/ns/<ns>/dc/<dc>/svc/<service>). A server also asks
// the agent whether intentions let the caller in
// (POST /v1/agent/connect/authorize); decisions are cached per certificate
// serial and dropped when an intention naming this service changes (a
// blocking intention match). A denied caller fails the handshake.
//
// Without Consul the same configurations come from tlsfiles: the chain is
// checked against the files' CA bundle, the server name against the
// certificate's DNS names, and every certificate the CA signed is let in.
//
// Only consul/api is used: Consul's own connect package lives in the main
// consul module (BUSL-1.1) and is deprecated.
package meshid

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/internal/tlsfiles"
)

// Config selects the source of the identity: Consul (Client and Service) or
// Files.
type Config struct {
	// Consul is the local agent's API client; its token needs service:write
	// on Service (a leaf certificate and authorizations for it) and reads
	// the intentions naming it.
	Consul *consulapi.Client
	// Service is the mesh service this process is: the name in its leaf
	// certificate and the destination intentions are checked against.
	Service string
	// Files is the identity when there is no Consul: a certificate, its key
	// and the CA bundle peers chain to.
	Files *tlsfiles.Files

	Logger     hclog.Logger          // nil: no logs
	Registerer prometheus.Registerer // nil: no metrics
	Namespace  string                // metric namespace; default "oasis"

	// AuthorizeTTL bounds how long an authorization is trusted when no
	// intention change dropped it first (default 1m): the intention watch
	// may lack the ACL to read intentions, or be failing.
	AuthorizeTTL time.Duration
	// AuthorizeTimeout bounds one authorization call to the agent (default
	// 2s); a caller that cannot be authorized in time is refused.
	AuthorizeTimeout time.Duration

	// OnOutboundChange, when set, is called after the intentions whose
	// source is Service change. Servers authorize a caller once per
	// connection, so a caller that keeps connections open (a pool) drops
	// its idle ones here, and its next requests are authorized anew.
	OnOutboundChange func()
}

var (
	// ErrNoSource: a Config with neither Consul nor Files, or both.
	ErrNoSource = errors.New("meshid: exactly one of Consul and Files is required")
	// ErrNoService: Consul without the service name.
	ErrNoService = errors.New("meshid: Service is required with Consul")
	// ErrNoCertificate: Files without a certificate and a CA bundle.
	ErrNoCertificate = errors.New("meshid: Files needs a certificate, its key and a CA bundle")
	// ErrDenied is a caller that intentions do not let in; handshake errors
	// wrap it.
	ErrDenied = errors.New("meshid: denied by intentions")
)

// Identity is the current certificate, the roots peers chain to, and (with
// Consul) the authorization of callers. Safe for concurrent use.
type Identity struct {
	cfg Config
	log hclog.Logger
	m   *metrics

	files  *tlsfiles.Files       // the file source
	consul atomic.Pointer[state] // the Consul source: nil until the first leaf and roots
	authz  *authorizer           // nil for files

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// state is one consistent view of the Consul source.
type state struct {
	cert        *tls.Certificate
	serial      string // the leaf's, as Consul writes it
	roots       *x509.CertPool
	trustDomain string
}

// New returns the identity. With Consul it waits (bounded by ctx) for the
// first leaf and roots, and follows them until Close.
func New(ctx context.Context, cfg Config) (*Identity, error) {
	if (cfg.Consul == nil) == (cfg.Files == nil) {
		return nil, ErrNoSource
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "oasis"
	}
	if cfg.AuthorizeTTL <= 0 {
		cfg.AuthorizeTTL = time.Minute
	}
	if cfg.AuthorizeTimeout <= 0 {
		cfg.AuthorizeTimeout = 2 * time.Second
	}
	id := &Identity{cfg: cfg, log: cfg.Logger.Named("meshid"), m: newMetrics(cfg.Namespace)}
	switch {
	case cfg.Files != nil:
		if cfg.Files.Certificate() == nil || cfg.Files.CAs() == nil {
			return nil, ErrNoCertificate
		}
		id.files = cfg.Files
	case cfg.Service == "":
		return nil, ErrNoService
	default:
		if err := id.startConsul(ctx); err != nil {
			return nil, fmt.Errorf("meshid: getting the Connect identity of %q from Consul: %w", cfg.Service, err)
		}
	}
	if err := id.m.register(cfg.Namespace, cfg.Registerer, id); err != nil {
		id.Close()
		return nil, err
	}
	return id, nil
}

// Close stops following Consul and returns when the watches have ended.
// Configurations already handed out keep the last certificate and roots.
// It returns nil: ending a watch has no error to report.
func (id *Identity) Close() error {
	if id.cancel != nil {
		id.cancel()
	}
	id.wg.Wait()
	return nil
}

// Mesh reports whether the identity is Consul's (SPIFFE names and
// intentions) rather than files'.
func (id *Identity) Mesh() bool { return id.files == nil }

// Service is the service name this identity speaks for ("" for files).
func (id *Identity) Service() string { return id.cfg.Service }

// TrustDomain is the mesh's trust domain ("" for files).
func (id *Identity) TrustDomain() string {
	if st := id.consul.Load(); st != nil {
		return st.trustDomain
	}
	return ""
}

// Serial is the serial number of the Connect leaf in use, as Consul writes
// it ("" for files).
func (id *Identity) Serial() string {
	if st := id.consul.Load(); st != nil {
		return st.serial
	}
	return ""
}

// certificate is the certificate to present now.
func (id *Identity) certificate() *tls.Certificate {
	if id.files != nil {
		return id.files.Certificate()
	}
	return id.consul.Load().cert
}

// roots is the pool peers' chains must end in now.
func (id *Identity) roots() *x509.CertPool {
	if id.files != nil {
		return id.files.CAs()
	}
	return id.consul.Load().roots
}
