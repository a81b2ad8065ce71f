package app

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/peers"
	"github.com/oasis-llm/oasis/router/scoring"
)

// validatePeers checks the -peers-* flags.
func (c Config) validatePeers() error {
	if c.PeersListen == "" {
		if c.PeersAdvertise != "" || c.PeersKeyFile != "" {
			return flagErr("-peers-listen", "required with -peers-advertise and -peers-key-file")
		}
		return nil
	}
	switch {
	case c.PeersInterval <= 0 || c.PeersInterval > peers.MaxInterval:
		return flagErr("-peers-interval", "want more than 0 and at most %v, got %v", peers.MaxInterval, c.PeersInterval)
	case c.PeersMinInterval <= 0 || c.PeersMinInterval > c.PeersInterval:
		return flagErr("-peers-min-interval", "want more than 0 and at most -peers-interval (%v), got %v", c.PeersInterval, c.PeersMinInterval)
	}
	for _, a := range []struct{ flag, v string }{{"-peers-listen", c.PeersListen}, {"-peers-advertise", c.PeersAdvertise}} {
		if a.v == "" {
			continue
		}
		if err := checkHostPort(a.v); err != nil {
			return flagErr(a.flag, "%w", err)
		}
	}
	return nil
}

// initAdmission builds the admission controller.
func (a *App) initAdmission() error {
	a.admission = admission.New()
	return nil
}

// initPeers joins, with -peers-listen, the datacenter's other routers:
// admission's max_in_flight and the keys' rate limits are split with them,
// and their decisions for engines without KV events are recorded here
// (cachestate.State.Record ignores engines with events and unknown ones).
// Without it, a router that uses Consul still counts the datacenter's
// live routers from their registrations and keeps its even share of those
// budgets (peers.Config.CountOnly): a system job of N routers never admits
// N times a cap. After initServer: the router's name among them
// (gossipName, and the counting's Name) starts with its service id, from
// the bound address.
func (a *App) initPeers() error {
	if a.cfg.PeersListen == "" {
		if a.consul == nil {
			return nil // no Consul: no registrations to count
		}
		p, err := peers.New(peers.Config{Name: a.serviceID(), CountOnly: true, Node: a.cfg.PeersNode, Ports: a.apiPorts(), Consul: a.consul,
			Local: a.peerLoad, OnChange: a.peersChanged, Logger: a.log.Named("peers"), Metrics: a.m})
		if err != nil {
			return fmt.Errorf("counting the datacenter's routers: %w", err)
		}
		a.usePeers(p)
		return nil
	}
	var key []byte
	if a.cfg.PeersKeyFile != "" {
		var err error
		if key, err = readGossipKey(a.cfg.PeersKeyFile); err != nil {
			return flagErr("-peers-key-file", "%w", err)
		}
	}
	p, err := peers.New(peers.Config{Name: a.gossipName(), Bind: a.cfg.PeersListen, Advertise: a.cfg.PeersAdvertise, Key: key,
		Consul: a.consul, Local: a.peerLoad, OnChange: a.peersChanged, OnPrefixes: a.cache.Record, Logger: a.log.Named("peers"), Metrics: a.m,
		Interval: a.cfg.PeersInterval, MinInterval: a.cfg.PeersMinInterval})
	if err != nil {
		return flagErr("-peers-listen", "%w", err)
	}
	a.usePeers(p)
	if !a.cfg.Register {
		a.log.Info("peers find this router only through a registration of service oasis-router with meta oasis_peers (e.g. the Nomad job's service block)",
			"oasis_peers", p.Addr())
	}
	// The load goes out as soon as this router's requests on an engine
	// change (peers.Schedule), for engines found from now on too.
	a.pool.OnChange(func(ws []*scoring.Worker) {
		for _, w := range ws {
			if w.Live != nil {
				w.Live.OnChange(p.Changed)
			}
		}
	})
	for _, w := range a.pool.All() {
		if w.Live != nil {
			w.Live.OnChange(p.Changed)
		}
	}
	return nil
}

// usePeers splits admission's caps and the keys' rates with p.
func (a *App) usePeers(p *peers.Peers) {
	a.peers = p
	a.admission.Share = p.ModelShare
	if a.auth != nil {
		a.auth.Share = p.KeyFraction
	}
}

// apiPorts are the ports of this router's API listeners (a registration
// on its Consul node at one of them is its own).
func (a *App) apiPorts() []int {
	var out []int
	for _, ln := range []net.Listener{a.ln, a.meshLn} {
		if ln == nil {
			continue
		}
		if ta, ok := ln.Addr().(*net.TCPAddr); ok {
			out = append(out, ta.Port)
		}
	}
	return out
}

// peerLoad is what this router tells its peers: admission's counts and
// highest queued band, its requests on each engine, and the rate each
// limited key is asked at.
func (a *App) peerLoad() peers.Load {
	l := peers.Load{Models: map[string]peers.ModelLoad{}, Engines: map[string]peers.EngineLoad{}}
	for model, ml := range a.admission.Loads() {
		l.Models[model] = peers.ModelLoad{InFlight: ml.InFlight, Queued: ml.Queued, Band: min(max(ml.Band, 0), peers.MaxBand)}
	}
	for _, w := range a.pool.All() {
		if w.Live == nil {
			continue
		}
		s := w.Live.Snapshot()
		if s.InFlight > 0 || s.PendingPrefillTokens > 0 {
			l.Engines[w.ID] = peers.EngineLoad{InFlight: s.InFlight, PendingPrefill: s.PendingPrefillTokens}
		}
	}
	if a.auth != nil {
		l.Keys = a.auth.Demand()
	}
	return l
}

// peersChanged follows the peers' loads: admission's shares may have grown,
// and each worker's load and prefill queue include the peers' requests.
func (a *App) peersChanged() {
	a.admission.Refill()
	loads := a.peers.EngineLoads()
	var total int64
	for _, w := range a.pool.All() {
		if w.Live != nil {
			e := loads[w.ID]
			w.Live.SetPeers(e.InFlight, e.PendingPrefill)
			total += e.InFlight
		}
	}
	a.m.PeersInFlight.Set(float64(total))
}

// readGossipKey reads -peers-key-file: 16, 24 or 32 bytes, base64 (as
// `openssl rand -base64 32` writes them; the file a Nomad template renders
// from a variable).
func readGossipKey(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(data)))
	if err != nil {
		return nil, fmt.Errorf("%s: want base64: %w", path, err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("%s: want 16, 24 or 32 bytes, got %d", path, n)
	}
	return key, nil
}

// serviceID is this router's Consul service id (and its name among its
// peers): from the -advertise address, or the bound -listen address.
func (a *App) serviceID() string {
	adv := a.cfg.Advertise
	if adv == "" && a.ln != nil {
		adv = a.ln.Addr().String()
	}
	return "oasis-router-" + strings.NewReplacer(":", "-", ".", "-").Replace(adv)
}

// gossipName is this router's name among its gossip peers: its service id
// and its gossip address as configured, unique in the datacenter even
// where every node's router listens on the same loopback address (the
// Nomad job's default), which memberlist requires.
func (a *App) gossipName() string {
	addr := a.cfg.PeersAdvertise
	if addr == "" {
		addr = a.cfg.PeersListen
	}
	return a.serviceID() + "-gossip-" + strings.NewReplacer(":", "-", ".", "-", "[", "", "]", "").Replace(addr)
}

// peersMeta is the registration's meta with the gossip address, or nil.
func (a *App) peersMeta() map[string]string {
	if a.peers == nil || a.peers.Addr() == "" {
		return nil
	}
	return map[string]string{peers.MetaAddr: a.peers.Addr()}
}
