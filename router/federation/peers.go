package federation

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/oasis-llm/oasis/internal/ctxsleep"
)

// Service is the Consul service name routers register their federation
// listener under, with meta MetaDC (the datacenter) and MetaModels (the
// models it serves, comma-separated; absent while it serves none). Consul
// caps a meta value at 512 bytes: a longer list continues in MetaModels_1,
// MetaModels_2, ... (ModelsMeta writes them, at most maxMetaChunks values
// and maxMetaModels names in all).
const (
	Service    = "oasis-router-federation"
	MetaDC     = "oasis_dc"
	MetaModels = "oasis_models"
)

// Bounds on the models one router announces: maxMetaChunks meta values of
// at most maxMetaValue bytes (Consul's cap), maxMetaModels names in all.
const (
	maxMetaChunks = 8
	maxMetaValue  = 512
	maxMetaModels = 256
)

// metaModelsKey is the meta key of the i-th chunk of the model list.
func metaModelsKey(i int) string {
	if i == 0 {
		return MetaModels
	}
	return MetaModels + "_" + strconv.Itoa(i)
}

// ModelsMeta adds models (sorted, valid names) to meta as MetaModels and
// its continuation keys, each value within Consul's 512 bytes; it returns
// how many models did not fit (left out from the end of the list).
func ModelsMeta(meta map[string]string, models []string) (dropped int) {
	chunk := 0
	var b strings.Builder
	flush := func() {
		if b.Len() > 0 {
			meta[metaModelsKey(chunk)] = b.String()
			b.Reset()
			chunk++
		}
	}
	defer flush()
	for i, m := range models {
		if i == maxMetaModels || len(m) > maxMetaValue { // the latter is no valid name
			return len(models) - i
		}
		if b.Len() > 0 && b.Len()+1+len(m) > maxMetaValue {
			if flush(); chunk == maxMetaChunks {
				return len(models) - i
			}
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m)
	}
	return 0
}

// Peer is another datacenter's router.
type Peer struct {
	DC   string
	Addr string // host:port of its federation (HTTP/3) listener
	// Models it serves: nil for any (a static peer that names none), empty
	// for none (a router with no engine yet: it is sent summaries, so it
	// can forward its own requests, but never forwarded to).
	Models []string
}

// peerSet is the routers known per remote datacenter, and whether each
// datacenter's list is stale (its Consul did not answer in time).
type peerSet struct {
	mu    sync.Mutex
	peers map[string][]Peer
	stale map[string]bool
}

func (p *peerSet) set(dc string, ps []Peer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peers[dc] = ps
	p.stale[dc] = false
}

func (p *peerSet) markStale(dc string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stale[dc] = true
}

func (p *peerSet) snapshot() map[string][]Peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]Peer, len(p.peers))
	for dc, ps := range p.peers {
		out[dc] = ps
	}
	return out
}

// Stale reports whether dc's peer list could not be refreshed lately.
func (p *peerSet) Stale(dc string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stale[dc]
}

// peersFromEntries turns one datacenter's health entries into peers. Meta
// is untrusted (any service in that datacenter can register the name):
// entries with a bad address, a datacenter other than the one asked, or bad
// model names are left out and counted.
func peersFromEntries(dc string, entries []*consulapi.ServiceEntry, bad func(string)) []Peer {
	var out []Peer
	for _, e := range entries {
		if e.Service == nil {
			continue
		}
		addr := e.Service.Address
		if addr == "" && e.Node != nil {
			addr = e.Node.Address
		}
		if net.ParseIP(addr) == nil && !validName(addr) || e.Service.Port <= 0 || e.Service.Port > 65535 {
			bad("address")
			continue
		}
		if e.Service.Meta[MetaDC] != dc {
			bad("dc")
			continue
		}
		models, ok := parseModelsMeta(e.Service.Meta)
		if !ok {
			bad("models")
			continue
		}
		out = append(out, Peer{DC: dc, Addr: net.JoinHostPort(addr, strconv.Itoa(e.Service.Port)), Models: models})
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// parseModelsMeta reads the model list ModelsMeta wrote: MetaModels and its
// continuation keys in order (a gap ends the list), each a non-empty
// comma-separated list of valid names within 512 bytes, at most
// maxMetaModels names in all. No MetaModels: serves none.
func parseModelsMeta(meta map[string]string) ([]string, bool) {
	models := []string{}
	for i := range maxMetaChunks {
		v, set := meta[metaModelsKey(i)]
		if !set {
			break
		}
		if v == "" || len(v) > maxMetaValue {
			return nil, false
		}
		for m := range strings.SplitSeq(v, ",") {
			if !validName(m) || len(models) == maxMetaModels {
				return nil, false
			}
			models = append(models, m)
		}
	}
	return models, true
}

// watchPeers follows the federation service in every other datacenter
// until ctx ends. Each datacenter has its own goroutine and each query its
// own deadline: a frozen remote Consul makes ?dc= queries hang for a minute
// or more, and must only ever mark that datacenter stale.
func (f *Federation) watchPeers(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	watched := map[string]bool{}
	for {
		dcs, err := f.datacenters(ctx)
		if err != nil && ctx.Err() == nil {
			f.log.Warn("listing Consul datacenters failed", "error", err)
		}
		for _, dc := range dcs {
			if dc == f.cfg.DC || watched[dc] || !validName(dc) {
				continue
			}
			watched[dc] = true
			wg.Add(1)
			go func() { defer wg.Done(); f.watchDC(ctx, dc) }()
		}
		if ctxsleep.Sleep(ctx, f.cfg.QueryWait) != nil {
			return
		}
	}
}

func (f *Federation) datacenters(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.QueryTimeout)
	defer cancel()
	// Catalog().Datacenters takes no context: the same endpoint through
	// the raw client does.
	var dcs []string
	_, err := f.cfg.Consul.Raw().Query("/v1/catalog/datacenters", &dcs, (&consulapi.QueryOptions{}).WithContext(ctx))
	return dcs, err
}

// watchDC runs blocking queries for the federation routers of dc.
func (f *Federation) watchDC(ctx context.Context, dc string) {
	var index uint64
	for ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, f.cfg.QueryWait+f.cfg.QueryTimeout)
		// Near keeps the query off the agent's streaming backend, which
		// answers a blocking query on a frozen datacenter from its own
		// subscription when the wait ends (old or no entries, no known
		// leader, no error): the query then goes to that datacenter's
		// servers, and a frozen one times out here.
		q := (&consulapi.QueryOptions{Datacenter: dc, WaitIndex: index, WaitTime: f.cfg.QueryWait,
			Near: "_agent"}).WithContext(qctx)
		entries, meta, err := f.cfg.Consul.Health().Service(Service, "", true, q)
		cancel()
		if err == nil && !meta.KnownLeader {
			err = errNoLeader // a datacenter between leaders: keep the last list
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.peers.markStale(dc)
			f.m.peersStale.WithLabelValues(dc).Set(1)
			f.log.Warn("querying a datacenter's routers failed; keeping the last list", "dc", dc, "error", err)
			index = 0
			_ = ctxsleep.Sleep(ctx, time.Second)
			continue
		}
		f.m.peersStale.WithLabelValues(dc).Set(0)
		if meta.LastIndex < index {
			index = 0
		} else {
			index = meta.LastIndex
		}
		f.peers.set(dc, peersFromEntries(dc, entries, f.badEntry))
	}
}

var errNoLeader = errors.New("the datacenter's Consul answered without a known leader")

func (f *Federation) badEntry(reason string) { f.m.badEntries.WithLabelValues(reason).Inc() }
