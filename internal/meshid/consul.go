package meshid

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// watchWait bounds each blocking query; the agent answers at once on change.
const watchWait = 5 * time.Minute

// startConsul loads the first leaf and roots, then follows them, and the
// intentions naming the service, until Close.
func (id *Identity) startConsul(ctx context.Context) error {
	var leaf leaf
	var roots roots
	var leafIdx, rootsIdx uint64
	err := untilReady(ctx, func() (err error) {
		if leaf, leafIdx, err = id.fetchLeaf(ctx, 0); err != nil {
			return err
		}
		roots, rootsIdx, err = id.fetchRoots(ctx, 0)
		return err
	})
	if err != nil {
		return err
	}
	id.consul.Store(&state{cert: leaf.cert, serial: leaf.serial, roots: roots.pool, trustDomain: roots.trustDomain})
	id.authz = newAuthorizer(id)
	wctx, cancel := context.WithCancel(context.Background())
	id.cancel = cancel
	var mu sync.Mutex // serialises the two writers of id.consul
	id.watch(wctx, "leaf", leafIdx, func(ctx context.Context, idx uint64) (uint64, error) {
		l, next, err := id.fetchLeaf(ctx, idx)
		if err == nil && next != idx {
			mu.Lock()
			st := *id.consul.Load()
			st.cert, st.serial = l.cert, l.serial
			id.consul.Store(&st)
			mu.Unlock()
			id.m.rotations.WithLabelValues("leaf").Inc()
			id.log.Info("Connect leaf certificate rotated", "service", id.cfg.Service, "serial", l.serial,
				"not_after", l.cert.Leaf.NotAfter)
		}
		return next, err
	})
	id.watch(wctx, "roots", rootsIdx, func(ctx context.Context, idx uint64) (uint64, error) {
		r, next, err := id.fetchRoots(ctx, idx)
		if err == nil && next != idx {
			mu.Lock()
			st := *id.consul.Load()
			st.roots, st.trustDomain = r.pool, r.trustDomain
			id.consul.Store(&st)
			mu.Unlock()
			id.m.rotations.WithLabelValues("roots").Inc()
			id.log.Info("Connect CA roots changed", "trust_domain", r.trustDomain)
		}
		return next, err
	})
	id.watch(wctx, "intentions", 0, id.authz.watchIntentions)
	if id.cfg.OnOutboundChange != nil {
		id.watch(wctx, "outbound_intentions", 0, id.watchOutbound)
	}
	return nil
}

// untilReady calls fn until it succeeds, fails other than with a server
// error, or ctx ends. A Consul agent answers 500 while its Connect CA is not
// ready yet (a secondary datacenter's, until its primary signed it), which
// start-up waits out.
func untilReady(ctx context.Context, fn func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := fn()
		var se consulapi.StatusError
		if err == nil || !errors.As(err, &se) || se.Code < 500 {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// watch runs one blocking-query loop: fn answers with the next index, or an
// error after which the loop backs off and starts over from index 0.
func (id *Identity) watch(ctx context.Context, what string, idx uint64, fn func(context.Context, uint64) (uint64, error)) {
	id.wg.Add(1)
	go func() {
		defer id.wg.Done()
		backoff := 100 * time.Millisecond
		for ctx.Err() == nil {
			next, err := fn(ctx, idx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				id.m.watchErrors.WithLabelValues(what).Inc()
				id.log.Warn("following Consul failed; keeping the last answer", "watch", what, "error", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 10*time.Second)
				idx = 0
				continue
			}
			backoff = 100 * time.Millisecond
			if next < idx {
				next = 0 // the index went back: start over, as Consul's docs advise
			}
			idx = next
		}
	}()
}

type leaf struct {
	cert   *tls.Certificate
	serial string
}

func (id *Identity) fetchLeaf(ctx context.Context, idx uint64) (leaf, uint64, error) {
	q := (&consulapi.QueryOptions{WaitIndex: idx, WaitTime: watchWait}).WithContext(ctx)
	lc, meta, err := id.cfg.Consul.Agent().ConnectCALeaf(id.cfg.Service, q)
	if err != nil {
		return leaf{}, 0, err
	}
	if meta.LastIndex == idx {
		return leaf{}, idx, nil
	}
	pair, err := tls.X509KeyPair([]byte(lc.CertPEM), []byte(lc.PrivateKeyPEM))
	if err != nil {
		return leaf{}, 0, errors.Join(errors.New("parsing the leaf certificate"), err)
	}
	return leaf{cert: &pair, serial: lc.SerialNumber}, meta.LastIndex, nil
}

type roots struct {
	pool        *x509.CertPool
	trustDomain string
}

func (id *Identity) fetchRoots(ctx context.Context, idx uint64) (roots, uint64, error) {
	q := (&consulapi.QueryOptions{WaitIndex: idx, WaitTime: watchWait}).WithContext(ctx)
	list, meta, err := id.cfg.Consul.Agent().ConnectCARoots(q)
	if err != nil {
		return roots{}, 0, err
	}
	if meta.LastIndex == idx {
		return roots{}, idx, nil
	}
	pool := x509.NewCertPool()
	for _, r := range list.Roots {
		pool.AppendCertsFromPEM([]byte(r.RootCertPEM))
	}
	if len(list.Roots) == 0 || list.TrustDomain == "" {
		return roots{}, 0, errors.New("the agent has no Connect CA roots: is Connect enabled?")
	}
	return roots{pool: pool, trustDomain: list.TrustDomain}, meta.LastIndex, nil
}
