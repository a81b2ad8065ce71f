package federation

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
)

// RouterHeader names, on a summary push, the router that sent it among its
// datacenter's routers (Config.Name). A datacenter runs one router per node
// (the Nomad system job), and each pushes its own summary: the receiver keeps
// one per router and sums them (merged), so a peer sees the whole
// datacenter's load, not whichever router pushed last. A push without it is
// kept under the empty name (a router of an older release: one slot per
// datacenter, the last push wins, as before).
const RouterHeader = "X-Oasis-Federation-Router"

// MaxRoutersPerDC bounds the routers whose summaries are kept for one
// datacenter: past it a new router's summary is taken only in place of one
// no longer fresh (else 503, counted as too_many_routers).
const MaxRoutersPerDC = 256

// maxRouterName bounds a RouterHeader value.
const maxRouterName = 128

// routerSummary is one router's last summary of its datacenter.
type routerSummary struct {
	models   map[string]ModelSummary
	received time.Time
}

// validRouterName: a RouterHeader value, empty or up to maxRouterName
// printable ASCII bytes without spaces.
func validRouterName(s string) bool {
	if len(s) > maxRouterName {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// randomName is a router's name when Config.Name is empty.
func randomName() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "router-" + hex.EncodeToString(b)
}

// store keeps router's summary of rd's datacenter, received at now; false
// when the datacenter already holds MaxRoutersPerDC fresh routers' and this
// is a new one. Caller holds f.mu.
func (rd *remoteDC) store(router string, models map[string]ModelSummary, now time.Time, fresh time.Duration) bool {
	if rd.routers == nil {
		rd.routers = map[string]*routerSummary{}
	}
	if _, ok := rd.routers[router]; !ok && len(rd.routers) >= MaxRoutersPerDC {
		if !rd.dropStale(now, fresh) || len(rd.routers) >= MaxRoutersPerDC {
			return false
		}
	}
	rd.routers[router] = &routerSummary{models: models, received: now}
	rd.received = now
	return true
}

// dropStale forgets the routers whose summary is older than fresh; true
// when it dropped any. Caller holds f.mu.
func (rd *remoteDC) dropStale(now time.Time, fresh time.Duration) bool {
	dropped := false
	for name, r := range rd.routers {
		if now.Sub(r.received) > fresh {
			delete(rd.routers, name)
			dropped = true
		}
	}
	return dropped
}

// merged is the datacenter's figures for model: the sum of its routers'
// summaries younger than fresh (one router per node, each reporting its own
// admission: in flight, queued and free slots add up; TTFT and queue wait
// are their mean, since a forwarded request lands on any one of them; the
// cached prefix is the longest any router's filter holds), with how many
// routers that is. With none fresh, the newest summary that has the model
// stands alone with fresh false (known, not usable). ok is false when no
// router reported the model. Caller holds f.mu.
func (rd *remoteDC) merged(model string, keys []uint64, now time.Time, fresh time.Duration) (m ModelSummary, cached, routers int, ok bool) {
	var newest *routerSummary
	var ttft, wait time.Duration
	for _, r := range rd.routers {
		ms, has := r.models[model]
		if !has {
			continue
		}
		if newest == nil || r.received.After(newest.received) {
			newest = r
		}
		if now.Sub(r.received) > fresh {
			continue
		}
		routers++
		m.InFlight = addSat(m.InFlight, ms.InFlight)
		m.Queued = addSat(m.Queued, ms.Queued)
		m.Free = addSat(m.Free, ms.Free)
		ttft += ms.TTFT
		wait += ms.QueueWait
		cached = max(cached, CachedBlocks(ms.Prefixes, keys))
	}
	switch {
	case routers > 0:
		m.Model, m.TTFT, m.QueueWait = model, ttft/time.Duration(routers), wait/time.Duration(routers)
		return m, cached, routers, true
	case newest != nil:
		ms := newest.models[model]
		return ms, CachedBlocks(ms.Prefixes, keys), 0, true
	}
	return ModelSummary{}, 0, 0, false
}

// addSat adds two counts, saturating at FreeUnlimited (an uncapped model's
// Free stays unlimited).
func addSat(a, b uint32) uint32 {
	if s := uint64(a) + uint64(b); s < FreeUnlimited {
		return uint32(s)
	}
	return FreeUnlimited
}

// Remote is what this router sees of datacenter dc's model now, as Route
// decides with it: the sum of dc's routers' fresh summaries (merged), the
// number of routers summed, and false when no router of dc reported the
// model.
func (f *Federation) Remote(dc, model string) (ModelSummary, int, bool) {
	now := f.cfg.now()
	fresh := f.cfg.Policy().SummaryStale
	f.mu.Lock()
	defer f.mu.Unlock()
	rd := f.remote[dc]
	if rd == nil {
		return ModelSummary{}, 0, false
	}
	m, _, n, ok := rd.merged(model, nil, now, fresh)
	return m, n, ok
}

// checkRouterName validates a push's RouterHeader.
func checkRouterName(s string) error {
	if !validRouterName(s) {
		return fmt.Errorf("federation: %s: want up to %d printable bytes without spaces", RouterHeader, maxRouterName)
	}
	return nil
}
