package policy

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/scoring"
)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Client reaches Consul; required.
	Client *consulapi.Client
	// Key is the policy document's key in Consul KV; required.
	Key string
	// Terms are the scoring terms a document may weigh; required.
	Terms *scoring.Registry
	// Metrics counts applied and rejected documents; nil counts them in
	// collectors registered nowhere.
	Metrics *metrics.Metrics
	// Logger receives the watcher's logs; nil discards them.
	Logger hclog.Logger
	// WaitTime bounds each blocking query (default 5m); Consul returns
	// earlier on change.
	WaitTime time.Duration
}

// Watcher keeps the current policy document from Consul KV up to date with
// blocking queries. Until the first read succeeds Current returns Default().
type Watcher struct {
	kv       *consulapi.KV
	key      string
	reg      *scoring.Registry
	log      hclog.Logger
	m        *metrics.Metrics
	waitTime time.Duration
	current  atomic.Pointer[Document]
	applied  atomic.Uint64 // ModifyIndex of the KV entry behind current (0: built-in default)
}

// NewWatcher returns a watcher of cfg.Key; Run starts it.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("creating policy watcher: a Consul client is required")
	case cfg.Key == "":
		return nil, errors.New("creating policy watcher: a KV key is required")
	case cfg.Terms == nil:
		return nil, errors.New("creating policy watcher: scoring terms are required")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.WaitTime <= 0 {
		cfg.WaitTime = 5 * time.Minute
	}
	w := &Watcher{kv: cfg.Client.KV(), key: cfg.Key, reg: cfg.Terms, log: cfg.Logger.Named("policy"), m: cfg.Metrics,
		waitTime: cfg.WaitTime}
	w.current.Store(Default())
	return w, nil
}

// Current returns the last good document. Never nil.
func (w *Watcher) Current() *Document { return w.current.Load() }

// AppliedIndex is the Consul ModifyIndex of the applied document (0 before any).
func (w *Watcher) AppliedIndex() uint64 { return w.applied.Load() }

// Run watches the key until ctx ends; it returns nil then. A missing key is
// created with the default document using check-and-set on index 0, so an
// operator's document is never overwritten.
func (w *Watcher) Run(ctx context.Context) error {
	var index, seen uint64
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: w.waitTime}).WithContext(ctx)
		pair, meta, err := w.kv.Get(w.key, q)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			w.log.Warn("reading policy failed; keeping the last good one", "key", w.key, "error", err)
			_ = ctxsleep.Sleep(ctx, backoff)
			backoff = min(backoff*2, 10*time.Second)
			continue
		}
		backoff = 250 * time.Millisecond
		// Consul may reset its index (snapshot restore); start over then.
		if meta.LastIndex < index {
			index = 0
		} else {
			index = meta.LastIndex
		}
		if pair == nil {
			w.writeDefault(ctx)
			continue
		}
		if pair.ModifyIndex == seen {
			continue // unchanged, or the same bad document: counted once
		}
		seen = pair.ModifyIndex
		w.apply(pair)
	}
	return nil
}

func (w *Watcher) apply(pair *consulapi.KVPair) {
	doc, err := Parse(pair.Value, w.reg)
	if err != nil {
		w.m.PolicyRejects.Inc()
		w.log.Error("rejected policy document; keeping the last good one", "key", w.key,
			"modify_index", pair.ModifyIndex, "error", err)
		return
	}
	w.current.Store(doc)
	w.applied.Store(pair.ModifyIndex)
	w.m.PolicyReloads.Inc()
	w.log.Info("applied policy document", "key", w.key, "modify_index", pair.ModifyIndex, "policy", doc.Policy)
}

func (w *Watcher) writeDefault(ctx context.Context) {
	data, err := json.MarshalIndent(Default(), "", "  ")
	if err != nil {
		w.log.Error("encoding default policy", "error", err)
		return
	}
	ok, _, err := w.kv.CAS(&consulapi.KVPair{Key: w.key, Value: data, ModifyIndex: 0}, (&consulapi.WriteOptions{}).WithContext(ctx))
	switch {
	case err != nil:
		w.log.Warn("writing default policy failed", "key", w.key, "error", err)
		_ = ctxsleep.Sleep(ctx, time.Second)
	case ok:
		w.log.Info("wrote default policy document", "key", w.key)
	}
}
