package gateway

import (
	"slices"
	"time"

	"github.com/oasis-llm/oasis/router/scoring"
)

// Ejection defaults. A worker whose engine died stays in Consul until its
// health check fails (the recipes check every 10 s); meanwhile every request
// routed to it pays a failed connection, a dial timeout when its host is
// gone, before its retry. Three refusals in a row are not a transient, and
// ten seconds spans one check interval.
const (
	DefaultEjectAfter = 3
	DefaultEjectFor   = 10 * time.Second
)

// connected records that wk answered (any status): its ejection, if any, ends.
func (g *Gateway) connected(wk *scoring.Worker) {
	if wk.Live != nil {
		wk.Live.Connected()
	}
}

// connectFailed records that no connection to wk could be made, and ejects
// it from routing once that happened EjectAfter times in a row.
func (g *Gateway) connectFailed(wk *scoring.Worker, reqID string) {
	if wk.Live == nil || !wk.Live.ConnectFailed(time.Now(), g.cfg.EjectAfter, g.cfg.EjectFor) {
		return
	}
	g.m.Ejections.WithLabelValues(wk.Model).Inc()
	g.log.Warn("engine unreachable; routing around it until it connects again or leaves discovery",
		"model", wk.Model, "worker", wk.ID, "eject_for", g.cfg.EjectFor, "request_id", reqID)
}

// routable drops ejected workers from ws, unless that would leave none: with
// every worker ejected, trying one beats refusing the request.
func routable(ws []*scoring.Worker, now time.Time) []*scoring.Worker {
	for i, w := range ws {
		if w.Live == nil || !w.Live.Ejected(now) {
			continue
		}
		out := slices.Clone(ws[:i])
		for _, w := range ws[i+1:] {
			if w.Live == nil || !w.Live.Ejected(now) {
				out = append(out, w)
			}
		}
		if len(out) == 0 {
			return ws
		}
		return out
	}
	return ws
}
