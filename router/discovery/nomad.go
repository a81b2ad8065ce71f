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

	"github.com/oasis-llm/oasis/internal/ctxsleep"
	"github.com/oasis-llm/oasis/router/metrics"
)

// Nomad feeds a Pool from Nomad's native service discovery (services with
// provider = "nomad"). Nomad's registrations carry no meta, so the oasis_*
// meta is read from the service block of the allocation's job, with the
// variables a meta value names resolved from the allocation as Nomad would
// (allocVars: ${node.unique.id}, ${NOMAD_ADDR_<label>} and the other port
// variables); a value naming anything else is dropped with a warning. Tags of the form
// oasis_model=NAME override it. Instances whose Nomad checks fail are left out.
// Registrations are read with blocking queries bounded by CheckInterval, so
// check results are re-read at least that often.
type Nomad struct {
	Client  *nomadapi.Client
	Service string
	Logger  hclog.Logger // nil: no logs
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
	log := n.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	log = log.Named("discovery.nomad")
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
			_ = ctxsleep.Sleep(ctx, backoff)
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
	vars := allocVars(alloc, r.NodeID)
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
				v = interpolateMeta(v, vars)
				if strings.Contains(v, "${") {
					log.Warn("service meta holds a variable the router cannot resolve; ignoring the value",
						"alloc", r.AllocID, "key", k, "value", v)
					continue
				}
				m[k] = v
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

// allocVars returns the interpolation variables of an allocation that service
// meta uses: the node id and, for every port label, the variables Nomad's
// task environment defines. Addresses are the host side, which is what a
// router outside the allocation can reach; NOMAD_PORT_<label> is the mapped
// port when the port maps one (bridge networking), as in Nomad.
func allocVars(alloc *nomadapi.Allocation, nodeID string) map[string]string {
	vars := map[string]string{"node.unique.id": nodeID}
	port := func(label, ip string, value, to int) {
		if label == "" {
			return
		}
		host := strconv.Itoa(value)
		inner := host
		if to > 0 {
			inner = strconv.Itoa(to)
		}
		vars["NOMAD_IP_"+label] = ip
		vars["NOMAD_HOST_IP_"+label] = ip
		vars["NOMAD_PORT_"+label] = inner
		vars["NOMAD_HOST_PORT_"+label] = host
		vars["NOMAD_ADDR_"+label] = net.JoinHostPort(ip, host)
		vars["NOMAD_HOST_ADDR_"+label] = net.JoinHostPort(ip, host)
	}
	res := alloc.AllocatedResources
	if res == nil {
		return vars
	}
	networks := res.Shared.Networks
	for _, tr := range res.Tasks {
		if tr != nil {
			networks = append(networks, tr.Networks...)
		}
	}
	for _, nw := range networks {
		if nw == nil {
			continue
		}
		for _, p := range append(append([]nomadapi.Port(nil), nw.ReservedPorts...), nw.DynamicPorts...) {
			port(p.Label, nw.IP, p.Value, p.To)
		}
	}
	// Group-level ports last: they are what current jobs use, and they carry
	// their own host IP.
	for _, p := range res.Shared.Ports {
		port(p.Label, p.HostIP, p.Value, p.To)
	}
	return vars
}

// interpolateMeta replaces each ${name} in v whose name vars holds; others
// are left in place for the caller to notice.
func interpolateMeta(v string, vars map[string]string) string {
	var b strings.Builder
	for {
		i := strings.Index(v, "${")
		if i < 0 {
			break
		}
		j := strings.IndexByte(v[i:], '}')
		if j < 0 {
			break
		}
		name := v[i+2 : i+j]
		val, ok := vars[name]
		if !ok {
			b.WriteString(v[:i+j+1])
		} else {
			b.WriteString(v[:i])
			b.WriteString(val)
		}
		v = v[i+j+1:]
	}
	b.WriteString(v)
	return b.String()
}
