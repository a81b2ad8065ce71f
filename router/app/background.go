package app

import (
	"net"
	"net/http"
	"strconv"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/enginestats"
)

// goBackground runs f until the background context ends; Close waits for it.
func (a *App) goBackground(f func()) {
	a.bgWG.Add(1)
	go func() { defer a.bgWG.Done(); f() }()
}

// startBackground starts discovery, the watchers and the metrics scraper.
func (a *App) startBackground() {
	if a.procs != nil {
		a.goBackground(func() { a.procs.Run(a.bg) })
	}
	a.startDiscovery()
	if a.peers != nil {
		a.goBackground(func() { _ = a.peers.Run(a.bg) })
	}
	if a.fed != nil {
		a.goBackground(func() { a.fed.Run(a.bg) })
	}
	if a.watcher != nil {
		a.goBackground(func() { a.watcher.Run(a.bg) })
	}
	if a.cfg.APIKeysKV {
		a.goBackground(func() { a.auth.WatchKV(a.bg, a.consul, a.cfg.KVPrefix+"/keys", a.m, a.log) })
	}
	if a.cfg.ScrapeInterval > 0 {
		scrapeCfg := enginestats.ScraperConfig{Pool: a.pool, HTTP: &http.Client{Transport: a.engines}, Interval: a.cfg.ScrapeInterval,
			Logger: a.log.Named("enginestats"), Metrics: a.m}
		if a.cfg.PowerFromNomad {
			scrapeCfg.Nomad = a.nomad
		}
		if sc, err := enginestats.NewScraper(scrapeCfg); err != nil {
			a.log.Error("engine metrics are not scraped", "error", err)
		} else {
			a.goBackground(func() { sc.Run(a.bg) })
		}
	}
}

// startDiscovery feeds the pool from the configured source, and the cache
// state from the kvcached instances' registrations.
func (a *App) startDiscovery() {
	switch a.cfg.Discovery {
	case DiscoveryConsul:
		src := &discovery.Consul{Client: a.consul, Service: a.cfg.Service, Tag: a.cfg.ServiceTag, Logger: a.log, Metrics: a.m,
			Connect: a.cfg.MeshEngines}
		a.goBackground(func() { src.Run(a.bg, a.pool) })
	case DiscoveryNomad:
		src := &discovery.Nomad{Client: a.nomad, Service: a.cfg.Service, Logger: a.log, Metrics: a.m}
		a.goBackground(func() { src.Run(a.bg, a.pool) })
	case DiscoveryStatic:
		a.pool.Set(instances(a.cfg.Engines))
	}
	if a.consul == nil || a.cfg.KVCachedService == "" {
		return
	}
	// kvcached registers in Consul (jobs/kvcached.nomad.hcl) whatever the engines use.
	src := &discovery.Consul{Client: a.consul, Service: a.cfg.KVCachedService, Logger: a.log}
	a.goBackground(func() {
		src.Watch(a.bg, func(ins []discovery.Instance) {
			kcs := discovery.KVCachesOf(ins)
			caches := make([]cachestate.KVCache, len(kcs))
			for i, k := range kcs {
				caches[i] = cachestate.KVCache{ID: k.ID, Address: k.Address, Node: k.Node,
					KVEvents: k.KVEvents, KVEventsReplay: k.KVEventsReplay}
			}
			a.cache.SyncKVCaches(a.bg, caches)
		})
	})
}

// register adds this router to Consul as service oasis-router with a check
// on /health: over HTTPS without verifying the certificate (Consul does not
// know the operator's CA) and, with mutual TLS, a TCP connect (Consul has
// no client certificate). It returns the service id ("" when not asked to).
func (a *App) register() (string, error) {
	if !a.cfg.Register {
		return "", nil
	}
	adv := a.cfg.Advertise
	if adv == "" {
		adv = a.ln.Addr().String()
	}
	host, portS, err := net.SplitHostPort(adv)
	if err != nil {
		return "", flagErr("-advertise", "%w", err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return "", flagErr("-advertise", "port %q: %w", portS, err)
	}
	check := &consulapi.AgentServiceCheck{Interval: "5s", Timeout: "2s", DeregisterCriticalServiceAfter: "1m"}
	switch {
	case a.cfg.TLSClientCA != "":
		check.TCP = adv
	case a.tls != nil:
		check.HTTP, check.TLSSkipVerify = "https://"+adv+"/health", true
	default:
		check.HTTP = "http://" + adv + "/health"
	}
	id := a.serviceID()
	err = a.consul.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: id, Name: "oasis-router", Address: host, Port: port, Tags: []string{"oasis"}, Check: check, Meta: a.peersMeta()})
	if err != nil {
		return "", flagErr("-register", "registering in Consul: %w", err)
	}
	a.log.Info("registered in Consul", "service", "oasis-router", "id", id)
	if a.fed != nil {
		a.goBackground(func() { a.registerFederation(check) })
	}
	return id, nil
}

func (a *App) deregister(serviceID string) {
	if serviceID == "" {
		return
	}
	if err := a.consul.Agent().ServiceDeregister(serviceID); err != nil {
		a.log.Warn("deregistering from Consul failed", "error", err)
	}
}
