package policy

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Watcher keeps the current policy document from Consul KV up to date with
// blocking queries. Until the first read succeeds Current returns Default().
type Watcher struct {
	kv      *consulapi.KV
	key     string
	reg     *scoring.Registry
	log     hclog.Logger
	m       *metrics.Metrics
	current atomic.Pointer[Document]
	applied atomic.Uint64 // ModifyIndex of the KV entry behind current (0: built-in default)

	// WaitTime bounds each blocking query; Consul returns earlier on change.
	WaitTime time.Duration
}

// NewWatcher returns a watcher of key.
func NewWatcher(client *consulapi.Client, key string, reg *scoring.Registry, m *metrics.Metrics, log hclog.Logger) *Watcher {
	w := &Watcher{kv: client.KV(), key: key, reg: reg, log: log.Named("policy"), m: m, WaitTime: 5 * time.Minute}
	w.current.Store(Default())
	return w
}

// Current returns the last good document. Never nil.
func (w *Watcher) Current() *Document { return w.current.Load() }

// AppliedIndex is the Consul ModifyIndex of the applied document (0 before any).
func (w *Watcher) AppliedIndex() uint64 { return w.applied.Load() }

// Run watches the key until ctx ends. A missing key is created with the
// default document using check-and-set on index 0, so an operator's document
// is never overwritten.
func (w *Watcher) Run(ctx context.Context) {
	var index, seen uint64
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: w.WaitTime}).WithContext(ctx)
		pair, meta, err := w.kv.Get(w.key, q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("reading policy failed; keeping the last good one", "key", w.key, "error", err)
			sleep(ctx, backoff)
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
		sleep(ctx, time.Second)
	case ok:
		w.log.Info("wrote default policy document", "key", w.key)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
