package discovery

import (
	"context"
	"net"
	"strconv"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/router/metrics"
)

// Consul feeds a Pool from Consul's health API with blocking queries on the
// passing instances of a service. A check failing or maintenance mode makes
// Consul answer the open query at once, so the instance leaves the pool as
// soon as Consul knows. When Consul cannot be reached the last pool stays and
// the discovery_stale metric is 1.
type Consul struct {
	Client  *consulapi.Client
	Service string       // default EngineService
	Tag     string       // optional tag filter
	Logger  hclog.Logger // nil: no logs
	Metrics *metrics.Metrics

	// WaitTime bounds each blocking query (default 5m).
	WaitTime time.Duration
}

// Run updates pool until ctx ends.
func (c *Consul) Run(ctx context.Context, pool *Pool) { c.Watch(ctx, pool.Set) }

// Watch calls fn with the passing instances of the service on every change
// until ctx ends. Metrics is optional here (nil counts nothing).
func (c *Consul) Watch(ctx context.Context, fn func([]Instance)) {
	svc := c.Service
	if svc == "" {
		svc = EngineService
	}
	wait := c.WaitTime
	if wait == 0 {
		wait = 5 * time.Minute
	}
	log := c.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.Named("discovery.consul")
	var index uint64
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx)
		entries, meta, err := c.Client.Health().Service(svc, c.Tag, true, q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if c.Metrics != nil {
				c.Metrics.DiscoveryErrors.Inc()
				c.Metrics.DiscoveryStale.Set(1)
			}
			log.Warn("querying Consul failed; serving the last known pool", "service", svc, "error", err)
			sleep(ctx, backoff)
			backoff = min(backoff*2, 5*time.Second)
			index = 0
			continue
		}
		backoff = 100 * time.Millisecond
		if c.Metrics != nil {
			c.Metrics.DiscoveryStale.Set(0)
			c.Metrics.DiscoveryLastSuccess.SetToCurrentTime()
		}
		if meta.LastIndex == index {
			continue // wait time elapsed without change
		}
		if meta.LastIndex < index {
			index = 0
		} else {
			index = meta.LastIndex
		}
		instances := make([]Instance, 0, len(entries))
		for _, e := range entries {
			addr := e.Service.Address
			if addr == "" && e.Node != nil {
				addr = e.Node.Address
			}
			instances = append(instances, Instance{
				ID:      e.Service.ID,
				Address: net.JoinHostPort(addr, strconv.Itoa(e.Service.Port)),
				Tags:    e.Service.Tags,
				Meta:    e.Service.Meta,
			})
		}
		fn(instances)
		log.Debug("instances updated", "service", svc, "instances", len(instances), "index", index)
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
