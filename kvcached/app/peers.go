package app

import (
	"context"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/kvcached/peer"
	"github.com/oasis-llm/oasis/kvcached/store"
)

// peerSet is the QUIC peer node, its identity and the Consul client that
// finds its peers (nil without ConsulAddr).
type peerSet struct {
	node   *peer.Node
	id     *meshid.Identity
	consul *consulapi.Client
	isSelf func(string) bool
}

func (p *peerSet) close() error {
	err := p.node.Close()
	p.id.Close()
	return err
}

// initPeers serves peers over QUIC with the node's identity (Consul Connect
// with --mesh, the --tls-* files otherwise).
func (a *App) initPeers() error {
	if a.cfg.QUICAddr == "" {
		return nil
	}
	c := a.cfg
	ps := &peerSet{}
	if c.ConsulAddr != "" {
		cc := consulapi.DefaultConfig()
		cc.Address = c.ConsulAddr
		var err error
		if ps.consul, err = consulapi.NewClient(cc); err != nil {
			return flagErr("--consul-addr", "creating Consul client: %w", err)
		}
	}
	files := peer.TLSFiles{CA: c.TLSCA, Cert: c.TLSCert, Key: c.TLSKey, ServerName: c.TLSServerName, VerifyAddress: c.TLSVerifyAddress}
	id, err := a.peerIdentity(files, ps.consul)
	if err != nil {
		return err
	}
	ps.id = id
	stls, ctls := peer.IdentityTLS(id, c.ConsulService, files)
	pc := peer.Config{ListenAddr: c.QUICAddr, ServerTLS: stls, ClientTLS: ctls, Local: a.store,
		Logger: a.log.Named("peer"), Registerer: a.reg, MaxValue: c.MaxValueBytes, Budget: a.budget,
		FetchTimeout: c.PeerTimeout, FilterInterval: c.PeerFilterInterval, Datacenters: c.PeerDatacenters,
		WANFetchTimeout: c.PeerWANTimeout, WANBytesPerSecond: c.PeerWANBytesPerSecond}
	if id.Mesh() {
		pc.Authorize = id.Authorize
	}
	if ps.node, err = peer.New(pc); err != nil {
		id.Close()
		return flagErr("--quic-addr", "%w", err)
	}
	ps.node.SetPeers(c.Peers)
	ps.isSelf = peer.SelfMatcher(c.QUICAdvertise, ps.node.Addr())
	a.peers, a.remote.n = ps, ps.node
	a.log.Info("serving peers over QUIC", "addr", ps.node.Addr().String(), "alpn", peer.ALPN, "mesh", id.Mesh())
	return nil
}

// peerIdentity is the node's mutual-TLS identity: its Connect leaf as
// service --consul-service with --mesh, the --tls-* files otherwise.
func (a *App) peerIdentity(files peer.TLSFiles, client *consulapi.Client) (*meshid.Identity, error) {
	if !a.cfg.Mesh {
		return peer.FilesIdentity(files, a.reg)
	}
	wctx, cancel := context.WithTimeout(a.bg, meshStartTimeout)
	defer cancel()
	id, err := meshid.New(wctx, meshid.Config{Consul: client, Service: a.cfg.ConsulService, Logger: a.log, Registerer: a.reg})
	if err != nil {
		return nil, flagErr("--mesh", "peer identity from Consul Connect: %w", err)
	}
	a.log.Info("peer identity from Consul Connect", "service", a.cfg.ConsulService, "trust_domain", id.TrustDomain())
	return id, nil
}

// startPeers serves peers and follows the peer set in Consul, when there is
// one, until Close: the local datacenter's, and each remote datacenter's in
// its own goroutine, with its own query timeout, so a datacenter that stops
// answering delays neither local discovery nor the others.
func (a *App) startPeers() {
	if a.peers == nil {
		return
	}
	a.bgWG.Add(1)
	go func() {
		defer a.bgWG.Done()
		_ = a.peers.node.Run(a.bg) // ends at Close
	}()
	if a.peers.consul == nil {
		return
	}
	ps, c, log := a.peers, a.cfg, a.log.Named("consul")
	a.watch(peer.ConsulConfig{Client: ps.consul, Service: c.ConsulService, IsSelf: ps.isSelf,
		Static: c.Peers, Logger: log, Set: ps.node.SetPeers})
	for _, dc := range c.PeerDatacenters {
		a.watch(peer.ConsulConfig{Client: ps.consul, Service: c.ConsulService, Datacenter: dc,
			QueryTimeout: c.PeerWANDiscoveryTimeout, IsSelf: ps.isSelf, Logger: log,
			Set:     func(addrs []string) { _ = ps.node.SetRemotePeers(dc, addrs) }, // dc is one of the node's
			Stale:   func(stale bool) { ps.node.SetDatacenterStale(dc, stale) },
			Queried: func(err error) { ps.node.CountDiscoveryQuery(dc, err) }})
		log.Info("following kvcached peers in a remote datacenter", "dc", dc, "fetch_timeout", c.PeerWANTimeout,
			"bytes_per_second", c.PeerWANBytesPerSecond)
	}
}

func (a *App) watch(cfg peer.ConsulConfig) {
	a.bgWG.Add(1)
	go func() {
		defer a.bgWG.Done()
		peer.WatchConsul(a.bg, cfg)
	}()
}

// lateRemote forwards to the peer node once it exists.
type lateRemote struct{ n *peer.Node }

func (r *lateRemote) MayHave(key string) bool { return r.n != nil && r.n.MayHave(key) }

func (r *lateRemote) Fetch(ctx context.Context, key string) ([]byte, error) {
	if r.n == nil {
		return nil, store.ErrNotFound
	}
	return r.n.Fetch(ctx, key)
}
