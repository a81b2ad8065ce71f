package app

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"time"

	"github.com/oasis-llm/oasis/router/gateway"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/router/tokens"
)

// initGateway builds the gateway over the pool, policy and terms, with the
// engine transport shared by proxying, metrics scraping and /tokenize.
func (a *App) initGateway() error {
	a.engines = gateway.NewEngineTransport(gateway.EngineTransportConfig{TLS: a.engineTLS()})
	a.enginesReady.Store(a.engines)
	// Prompt tokens, computed only when a term or the cache learning asks.
	tok := tokens.NewAutoEngine(tokens.EngineConfig{Replicas: func(model string) []tokens.Replica {
		ws := a.pool.Workers(model)
		out := make([]tokens.Replica, len(ws))
		for i, w := range ws {
			out[i] = tokens.Replica{Address: w.Address, Engine: w.Engine}
		}
		return out
	}, Client: &http.Client{Transport: a.engines, Timeout: 2 * time.Second}, Metrics: a.m})
	respKey, err := a.responseIDKey()
	if err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Config{
		Pool: a.pool, Policy: a.policy, Selector: scoring.NewSelector(scoring.SelectorConfig{Registry: a.terms}), Admission: a.admission,
		Metrics: a.m, Gatherer: a.reg, Logger: a.log, Auth: a.auth,
		MaxBodyBytes: a.cfg.MaxBodyBytes, BodyReadTimeout: a.cfg.BodyReadTimeout,
		EjectAfter: a.cfg.EjectAfter, EjectFor: a.cfg.EjectFor, MaxLoadedAdapters: a.cfg.MaxLoadedAdapters,
		Transport: a.engines, Prepare: tok.Prepare, OnPick: a.learn, OnAccept: a.record, OnRefuse: a.forget, Federation: a.fed,
		TracerProvider: a.tracer, CORS: a.corsConfig(), ResponseIDKey: respKey,
	})
	if err != nil {
		return err
	}
	a.gw, a.forwarded = gw, gw.ForwardedHandler()
	// Per model and role, for autoscalers (observability/README.md "Scaling signals").
	return a.reg.Register(metrics.NewScalingCollector(gw.ScalingSignals))
}

// learn is told every routing decision. Where the prefix term scored the
// request it counts how much of the prompt the chosen worker held and, for
// an engine with KV events, records the decision in flight at once: the
// engine's events come only after its queue and prefill (for a
// non-streamed request after the 2xx head too), and requests following the
// same new prefix meanwhile should find it (cachestate's InflightTTL).
func (a *App) learn(_ context.Context, _ scoring.Config, req *scoring.Request, w *scoring.Worker) {
	keys, matched, ok := req.PrefixResult(w.ID)
	if !ok || len(keys) == 0 {
		return
	}
	a.m.PrefixRequestBlocks.WithLabelValues(w.Model).Add(float64(len(keys)))
	a.m.PrefixMatchedBlocks.WithLabelValues(w.Model).Add(float64(matched))
	if a.cache.EventDriven(w.ID) {
		a.cache.Record(w.ID, keys)
	}
}

// forget is told every engine that did not take a request it was picked
// for: an in-flight entry learn recorded for it is taken back, so that a
// prompt an engine refuses is not credited to it (a client could otherwise
// point other requests with that prefix at an engine that never computed
// it, for up to the TTL). Entries of other requests with the same blocks on
// that engine go too: they come back with its events.
func (a *App) forget(_ context.Context, _ scoring.Config, req *scoring.Request, w *scoring.Worker) {
	keys, _, ok := req.PrefixResult(w.ID)
	if ok && len(keys) > 0 && a.cache.EventDriven(w.ID) {
		a.cache.Forget(w.ID, keys)
	}
}

// record is told every engine that accepted a request (a 2xx answer) and,
// for engines without KV events, records the decision as the approximate
// view of that worker's cache: an engine that refused the prompt never
// cached it. The keys are the prefix term's, computed at the worker's block
// size or, where it advertises none, the term's default: the recorded view
// matches what the term will look up. With peers the decision goes to the
// datacenter's other routers too (peers.Routed), so that each learns the
// engine's cache from every router's decisions, not from its own 1/N.
func (a *App) record(_ context.Context, _ scoring.Config, req *scoring.Request, w *scoring.Worker) {
	keys, _, ok := req.PrefixResult(w.ID)
	if ok && len(keys) > 0 && !a.cache.EventDriven(w.ID) {
		a.cache.Record(w.ID, keys)
		if a.peers != nil {
			a.peers.Routed(w.ID, keys)
		}
	}
}

// responseIDKey reads -response-id-key-file: nil when it is not set.
func (a *App) responseIDKey() ([]byte, error) {
	if a.cfg.ResponseIDKeyFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(a.cfg.ResponseIDKeyFile)
	if err != nil {
		return nil, flagErr("-response-id-key-file", "%w", err)
	}
	if b = bytes.TrimSpace(b); len(b) < gateway.MinResponseIDKey {
		return nil, flagErr("-response-id-key-file", "%s: the key must be at least %d bytes, got %d",
			a.cfg.ResponseIDKeyFile, gateway.MinResponseIDKey, len(b))
	}
	return b, nil
}

// corsConfig is the gateway's CORS configuration: nil (off) unless
// -cors-origins names origins.
func (a *App) corsConfig() *gateway.CORS {
	if len(a.cfg.CORSOrigins) == 0 {
		return nil
	}
	return &gateway.CORS{Origins: a.cfg.CORSOrigins, Methods: a.cfg.CORSMethods, Headers: a.cfg.CORSHeaders}
}
