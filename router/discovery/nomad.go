package discovery

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/router/metrics"
)

// Nomad feeds a Pool from Nomad's native service discovery (services with
// provider = "nomad"). Nomad's registrations carry no meta, so the oasis_*
// meta is read from the service block of the allocation's job (with
// ${node.unique.id} resolved to the registration's node); tags of the form
// oasis_model=NAME override it. Instances whose Nomad checks fail are left out.
// Registrations are read with blocking queries bounded by CheckInterval, so
// check results are re-read at least that often.
type Nomad struct {
	Client  *nomadapi.Client
	Service string
	Log     hclog.Logger
	Metrics *metrics.Metrics

	// CheckInterval bounds each blocking query and therefore how late a
	// failed Nomad check is noticed (default 1s).
	CheckInterval time.Duration

	mu   sync.Mutex
	meta map[string]map[string]string // alloc id → service meta
}

// Run updates pool until ctx ends.
func (n *Nomad) Run(ctx context.Context, pool *Pool) {
	svc := n.Service
	if svc == "" {
		svc = EngineService
	}
	wait := n.CheckInterval
	if wait == 0 {
		wait = time.Second
	}
	log := n.Log.Named("discovery.nomad")
	var index uint64
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		q := (&nomadapi.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx)
		regs, meta, err := n.Client.Services().Get(svc, q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.Metrics.DiscoveryErrors.Inc()
			n.Metrics.DiscoveryStale.Set(1)
			log.Warn("querying Nomad failed; serving the last known pool", "service", svc, "error", err)
			sleep(ctx, backoff)
			backoff = min(backoff*2, 5*time.Second)
			index = 0
			continue
		}
		backoff = 100 * time.Millisecond
		if meta.LastIndex < index {
			index = 0
		} else {
			index = meta.LastIndex
		}
		instances := make([]Instance, 0, len(regs))
		live := map[string]bool{}
		for _, r := range regs {
			live[r.AllocID] = true
			if !n.checksPass(ctx, r) {
				continue
			}
			instances = append(instances, Instance{
				ID:      r.ID,
				Address: net.JoinHostPort(r.Address, strconv.Itoa(r.Port)),
				Tags:    r.Tags,
				Meta:    n.serviceMeta(ctx, r, log),
			})
		}
		n.forget(live)
		n.Metrics.DiscoveryStale.Set(0)
		n.Metrics.DiscoveryLastSuccess.SetToCurrentTime()
		pool.Set(instances)
	}
}

// checksPass reports whether every Nomad check of the registration's service
// in its allocation passes. No checks, or a client that cannot be asked,
// counts as passing (the registration itself is the liveness signal).
func (n *Nomad) checksPass(ctx context.Context, r *nomadapi.ServiceRegistration) bool {
	st, err := n.Client.Allocations().Checks(r.AllocID, (&nomadapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return true
	}
	for _, c := range st {
		if c.Service == r.ServiceName && c.Mode == "healthiness" && c.Status != "success" {
			return false
		}
	}
	return true
}

func (n *Nomad) serviceMeta(ctx context.Context, r *nomadapi.ServiceRegistration, log hclog.Logger) map[string]string {
	n.mu.Lock()
	m, ok := n.meta[r.AllocID]
	n.mu.Unlock()
	if ok {
		return m
	}
	alloc, _, err := n.Client.Allocations().Info(r.AllocID, (&nomadapi.QueryOptions{}).WithContext(ctx))
	if err != nil || alloc.Job == nil {
		log.Warn("reading allocation for service meta failed", "alloc", r.AllocID, "error", err)
		return nil
	}
	m = map[string]string{}
	for _, tg := range alloc.Job.TaskGroups {
		if tg.Name == nil || *tg.Name != alloc.TaskGroup {
			continue
		}
		services := tg.Services
		for _, t := range tg.Tasks {
			services = append(services, t.Services...)
		}
		for _, s := range services {
			if s.Name != r.ServiceName {
				continue
			}
			for k, v := range s.Meta {
				m[k] = strings.ReplaceAll(v, "${node.unique.id}", r.NodeID)
			}
		}
	}
	if m[MetaNode] == "" {
		m[MetaNode] = r.NodeID
	}
	n.mu.Lock()
	if n.meta == nil {
		n.meta = map[string]map[string]string{}
	}
	n.meta[r.AllocID] = m
	n.mu.Unlock()
	return m
}

func (n *Nomad) forget(live map[string]bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for id := range n.meta {
		if !live[id] {
			delete(n.meta, id)
		}
	}
}
