package discovery

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
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

	// Connect finds the service's instances in the service mesh instead:
	// each instance's address is that of its sidecar proxy (or its own, for
	// a Connect-native instance), which the router dials with its mesh
	// identity. The instance keeps the service's ID, tags and meta, so the
	// routing and cache state know it by the same name as outside the mesh.
	Connect bool
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
		instances, meta, err := c.query(ctx, svc, q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if c.Metrics != nil {
				c.Metrics.DiscoveryErrors.Inc()
				c.Metrics.DiscoveryStale.Set(1)
			}
			log.Warn("querying Consul failed; serving the last known pool", "service", svc, "error", err)
			_ = ctxsleep.Sleep(ctx, backoff)
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
		fn(instances)
		log.Debug("instances updated", "service", svc, "instances", len(instances), "index", index)
	}
}

// Instances is one non-blocking query: the passing instances of the
// service as Watch would deliver them now, for callers that need one answer
// (the Terraform provider's oasis_pool) rather than a watch.
func (c *Consul) Instances(ctx context.Context) ([]Instance, error) {
	svc := c.Service
	if svc == "" {
		svc = EngineService
	}
	instances, _, err := c.query(ctx, svc, (&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("querying the passing instances of %s: %w", svc, err)
	}
	return instances, nil
}

// query is one (blocking) health query: the passing instances of svc, or
// with Connect its passing mesh endpoints joined with the service's own
// registrations.
func (c *Consul) query(ctx context.Context, svc string, q *consulapi.QueryOptions) ([]Instance, *consulapi.QueryMeta, error) {
	if !c.Connect {
		entries, meta, err := c.Client.Health().Service(svc, c.Tag, true, q)
		if err != nil {
			return nil, nil, err
		}
		out := make([]Instance, 0, len(entries))
		for _, e := range entries {
			out = append(out, instance(e, e))
		}
		return out, meta, nil
	}
	// The mesh endpoints (sidecars carry their own tags and meta), blocking;
	// then the services themselves as of now: a sidecar's checks include
	// its service's (Nomad adds an alias check), so the blocking query
	// answers when either changes.
	endpoints, meta, err := c.Client.Health().Connect(svc, "", true, q)
	if err != nil {
		return nil, nil, err
	}
	services, _, err := c.Client.Health().Service(svc, c.Tag, true, (&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, nil, err
	}
	byID := make(map[string]*consulapi.ServiceEntry, len(services))
	for _, e := range services {
		byID[e.Service.ID] = e
	}
	out := make([]Instance, 0, len(endpoints))
	for _, e := range endpoints {
		id := e.Service.ID
		if e.Service.Kind == consulapi.ServiceKindConnectProxy {
			if e.Service.Proxy == nil {
				continue
			}
			id = e.Service.Proxy.DestinationServiceID
		}
		if s, ok := byID[id]; ok && s.Node != nil && e.Node != nil && s.Node.Node == e.Node.Node {
			out = append(out, instance(s, e))
		}
	}
	return out, meta, nil
}

// instance is the service registration s reached at endpoint at (s itself
// outside the mesh, its sidecar inside).
func instance(s, at *consulapi.ServiceEntry) Instance {
	addr := at.Service.Address
	if addr == "" && at.Node != nil {
		addr = at.Node.Address
	}
	return Instance{
		ID:      s.Service.ID,
		Address: net.JoinHostPort(addr, strconv.Itoa(at.Service.Port)),
		Tags:    s.Service.Tags,
		Meta:    s.Service.Meta,
	}
}
