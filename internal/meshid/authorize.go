package meshid

import (
	"context"
	"fmt"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// authorizer asks the local agent whether intentions let a caller reach the
// service, and remembers the answer per certificate serial until an
// intention naming the service changes or AuthorizeTTL passes.
type authorizer struct {
	id *Identity

	mu       sync.Mutex
	cache    map[string]decision // by serial
	inflight map[string]*call
	gen      uint64 // bumped by forget: an answer asked for before is not cached
}

type decision struct {
	allowed bool
	reason  string
	at      time.Time
}

type call struct {
	done chan struct{}
	d    decision
	err  error
}

// maxCached bounds the cache: past it, the cache starts over (callers are
// few services, and each rotates its leaf every few days).
const maxCached = 4096

func newAuthorizer(id *Identity) *authorizer {
	return &authorizer{id: id, cache: map[string]decision{}, inflight: map[string]*call{}}
}

// authorize decides for the caller whose leaf has uri and serial.
func (a *authorizer) authorize(uri, serial string) error {
	a.mu.Lock()
	if d, ok := a.cache[serial]; ok && time.Since(d.at) < a.id.cfg.AuthorizeTTL {
		a.mu.Unlock()
		a.id.m.authorizations.WithLabelValues(result(d.allowed), "true").Inc()
		return d.err(uri)
	}
	c, ok := a.inflight[serial]
	if !ok {
		c = &call{done: make(chan struct{})}
		a.inflight[serial] = c
		go a.ask(c, uri, serial, a.gen)
	}
	a.mu.Unlock()
	<-c.done
	if c.err != nil {
		a.id.m.authorizations.WithLabelValues("error", "false").Inc()
		return fmt.Errorf("meshid: authorizing %s: %w", uri, c.err)
	}
	a.id.m.authorizations.WithLabelValues(result(c.d.allowed), "false").Inc()
	return c.d.err(uri)
}

func (d decision) err(uri string) error {
	if d.allowed {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrDenied, uri, d.reason)
}

func result(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// ask calls the agent, bounded by AuthorizeTimeout (the API call takes no
// context: a hung agent leaves this goroutine behind until its HTTP client
// gives up, but never the handshake).
func (a *authorizer) ask(c *call, uri, serial string, gen uint64) {
	type answer struct {
		r   *consulapi.AgentAuthorize
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		r, err := a.id.cfg.Consul.Agent().ConnectAuthorize(&consulapi.AgentAuthorizeParams{
			Target: a.id.cfg.Service, ClientCertURI: uri, ClientCertSerial: serial})
		ch <- answer{r, err}
	}()
	t := time.NewTimer(a.id.cfg.AuthorizeTimeout)
	defer t.Stop()
	select {
	case ans := <-ch:
		if ans.err != nil {
			c.err = ans.err
		} else {
			c.d = decision{allowed: ans.r.Authorized, reason: ans.r.Reason, at: time.Now()}
		}
	case <-t.C:
		c.err = fmt.Errorf("the agent did not answer within %s", a.id.cfg.AuthorizeTimeout)
	}
	a.mu.Lock()
	delete(a.inflight, serial)
	if c.err == nil && gen == a.gen {
		if len(a.cache) >= maxCached {
			a.cache = map[string]decision{}
		}
		a.cache[serial] = c.d
	}
	a.mu.Unlock()
	close(c.done)
}

// forget drops every cached decision.
func (a *authorizer) forget() {
	a.mu.Lock()
	a.cache = map[string]decision{}
	a.gen++
	a.mu.Unlock()
}

// watchIntentions is one blocking query on the intentions whose destination
// is the service (service-intentions config entries included); any change
// drops the cache.
func (a *authorizer) watchIntentions(ctx context.Context, idx uint64) (uint64, error) {
	q := (&consulapi.QueryOptions{WaitIndex: idx, WaitTime: watchWait}).WithContext(ctx)
	_, meta, err := a.id.cfg.Consul.Connect().IntentionMatch(&consulapi.IntentionMatch{
		By: consulapi.IntentionMatchDestination, Names: []string{a.id.cfg.Service}}, q)
	if err != nil {
		return 0, err
	}
	if idx != 0 && meta.LastIndex != idx {
		a.forget()
		a.id.m.intentionChanges.Inc()
		a.id.log.Debug("intentions changed; cached authorizations dropped", "service", a.id.cfg.Service)
	}
	return meta.LastIndex, nil
}

// watchOutbound is one blocking query on the intentions whose source is the
// service; a change calls OnOutboundChange.
func (id *Identity) watchOutbound(ctx context.Context, idx uint64) (uint64, error) {
	q := (&consulapi.QueryOptions{WaitIndex: idx, WaitTime: watchWait}).WithContext(ctx)
	_, meta, err := id.cfg.Consul.Connect().IntentionMatch(&consulapi.IntentionMatch{
		By: consulapi.IntentionMatchSource, Names: []string{id.cfg.Service}}, q)
	if err != nil {
		return 0, err
	}
	if idx != 0 && meta.LastIndex != idx {
		id.log.Debug("intentions from this service changed", "service", id.cfg.Service)
		id.cfg.OnOutboundChange()
	}
	return meta.LastIndex, nil
}
