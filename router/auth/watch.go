package auth

import (
	"context"
	"os"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/router/metrics"
)

// LoadFile reads a key set file into a.
func (a *Authenticator) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	specs, err := Parse(data)
	if err != nil {
		return err
	}
	a.Set(specs)
	return nil
}

// WatchKV keeps a's key set equal to the document at key in Consul KV, with
// blocking queries, until ctx ends. An invalid document is rejected and the
// current keys stay; a missing key means no keys (every request refused).
// Reloads are counted in m and logged to log; nil counts them in collectors
// registered nowhere and discards the logs.
func (a *Authenticator) WatchKV(ctx context.Context, client *consulapi.Client, key string, m *metrics.Metrics, log hclog.Logger) {
	if m == nil {
		m = metrics.New(prometheus.NewRegistry())
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.Named("auth")
	var index, seen uint64
	for ctx.Err() == nil {
		pair, meta, err := client.KV().Get(key, (&consulapi.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("reading API keys from Consul failed; keeping current keys", "key", key, "error", err)
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			continue
		}
		if meta.LastIndex < index {
			index = 0
		} else {
			index = meta.LastIndex
		}
		if pair == nil {
			if seen != 0 || a.Len() > 0 {
				log.Warn("API key document deleted; refusing all requests", "key", key)
			}
			a.Set(nil)
			seen = 0
			continue
		}
		if pair.ModifyIndex == seen {
			continue
		}
		seen = pair.ModifyIndex
		specs, err := Parse(pair.Value)
		if err != nil {
			m.KeyReloads.WithLabelValues("rejected").Inc()
			log.Error("rejected API key document; keeping current keys", "key", key, "error", err)
			continue
		}
		a.Set(specs)
		m.KeyReloads.WithLabelValues("ok").Inc()
		log.Info("loaded API keys", "key", key, "count", len(specs))
	}
}
