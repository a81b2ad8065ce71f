// Package app assembles oasis-kvcached from its packages: the memory plan
// that splits --ram-bytes, the tiered store (RAM, then SSD), presence
// events, peers over QUIC (found in Consul, local and remote datacenters),
// the Redis-protocol server and the HTTP endpoints. cmd/oasis-kvcached only
// parses flags into a Config and runs an App until a signal.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/oasis-llm/oasis/kvcached/presence"
	"github.com/oasis-llm/oasis/kvcached/resp"
	"github.com/oasis-llm/oasis/kvcached/server"
	"github.com/oasis-llm/oasis/kvcached/store"
)

// App is one assembled kvcached. New builds it and binds its listeners
// without serving; Run serves until its context ends, then flushes the
// store and closes everything.
type App struct {
	cfg Config
	log hclog.Logger
	reg *prometheus.Registry

	plan     MemoryPlan
	budget   *resp.Budget
	password string

	presence *presence.Publisher // nil without EventsEndpoint
	store    *store.Store
	remote   *lateRemote
	peers    *peerSet // nil without QUICAddr
	srv      *server.Server
	ln       net.Listener
	http     *http.Server // nil without HTTPAddr
	httpLn   net.Listener

	// bg is the context of what runs beside the servers (Consul watches,
	// the mesh identity's watches, the presence publisher): Close ends it.
	bg        context.Context
	bgCancel  context.CancelFunc
	bgWG      sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New validates cfg, opens the store and binds kvcached's listeners. Errors
// name the flag at fault (*ConfigError) where one is. Call Run, or Close if
// it will not run.
func New(cfg Config) (*App, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: cfg.Logger, remote: &lateRemote{}}
	a.bg, a.bgCancel = context.WithCancel(context.Background())
	steps := []func() error{a.initMemory, a.initPassword, a.initMetrics, a.initPresence, a.initStore,
		a.initPeers, a.initServer, a.initHTTP}
	for _, step := range steps {
		if err := step(); err != nil {
			a.Close()
			return nil, err
		}
	}
	return a, nil
}

// Addr is the Redis-protocol listener's address.
func (a *App) Addr() net.Addr { return a.ln.Addr() }

// HTTPAddr is the HTTP listener's address, nil without Config.HTTPAddr.
func (a *App) HTTPAddr() net.Addr {
	if a.httpLn == nil {
		return nil
	}
	return a.httpLn.Addr()
}

// ReloadPassword reads Config.PasswordFile again (main calls it on SIGHUP,
// what the Nomad job's template sends when the password changes), so a new
// password takes effect without a restart, which would empty the RAM tier.
// A file that cannot be read or is empty keeps the current password.
func (a *App) ReloadPassword() error {
	if a.cfg.PasswordFile == "" {
		return nil
	}
	p, err := readPassword(a.cfg.PasswordFile)
	if err != nil {
		a.log.Error("keeping the current password", "error", err)
		return err
	}
	a.srv.SetPassword(p)
	a.log.Info("password reloaded", "file", a.cfg.PasswordFile)
	return nil
}

// Close releases an App that will not Run (or has run); it may be called
// more than once.
func (a *App) Close() error {
	a.closeOnce.Do(func() {
		a.bgCancel()
		var errs []error
		if a.http != nil {
			errs = append(errs, a.http.Close())
		} else if a.httpLn != nil {
			errs = append(errs, ignoreClosed(a.httpLn.Close()))
		}
		if a.srv != nil {
			errs = append(errs, a.srv.Close())
		}
		if a.ln != nil {
			errs = append(errs, ignoreClosed(a.ln.Close()))
		}
		a.bgWG.Wait()
		if a.peers != nil {
			errs = append(errs, a.peers.close())
		}
		if a.store != nil {
			errs = append(errs, a.store.Close())
		}
		if a.presence != nil {
			errs = append(errs, a.presence.Close())
		}
		a.closeErr = errors.Join(errs...)
	})
	return a.closeErr
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (a *App) initMemory() error {
	plan, err := PlanMemory(a.cfg.RAMBytes, a.cfg.MaxValueBytes, a.cfg.DiskBytes > 0)
	if err != nil {
		return err
	}
	a.plan = plan
	a.budget = resp.NewBudget(plan.Inflight)
	return nil
}

func (a *App) initPassword() error {
	a.password = a.cfg.Password
	if a.cfg.PasswordFile == "" {
		return nil
	}
	p, err := readPassword(a.cfg.PasswordFile)
	if err != nil {
		return &ConfigError{Flag: "--password-file", Err: err}
	}
	a.password = p
	return nil
}

func (a *App) initMetrics() error {
	a.reg = a.cfg.Registry
	if a.reg == nil {
		a.reg = prometheus.NewRegistry()
		a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return nil
}

func (a *App) initPresence() error {
	if a.cfg.EventsEndpoint == "" {
		return nil
	}
	p, err := presence.New(presence.Config{Endpoint: a.cfg.EventsEndpoint, ReplayEndpoint: a.cfg.EventsReplayEndpoint,
		BlockSize: a.cfg.EventsBlockSize, Logger: a.log.Named("presence"), Registerer: a.reg})
	if err != nil {
		return flagErr("--kv-events-endpoint", "%w", err)
	}
	a.presence = p
	a.log.Info("publishing block presence events", "endpoint", a.cfg.EventsEndpoint)
	return nil
}

// initStore opens the tiers. The store and the peer node need each other:
// the store asks peers on a miss, peers serve from the store; a.remote
// breaks the cycle.
func (a *App) initStore() error {
	var observer store.Observer
	if a.presence != nil {
		observer = a.presence
	}
	st, err := store.Open(store.Config{
		RAMBytes: a.plan.Tier, DiskBytes: a.cfg.DiskBytes, Dir: a.cfg.DataDir, MaxValue: a.cfg.MaxValueBytes, PoolBytes: a.plan.Pool,
		Logger: a.log.Named("store"), Metrics: store.NewMetrics(a.reg), Observer: observer, Remote: a.remote,
	})
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	a.store = st
	return nil
}

func (a *App) initServer() error {
	srv, err := server.New(server.Config{Store: a.store, Logger: a.log.Named("resp"), Registerer: a.reg, Password: a.password,
		MaxBulk: a.cfg.MaxValueBytes, Budget: a.budget, UnauthenticatedBytes: a.plan.Unauth,
		IdleTimeout: disabledIfZero(a.cfg.IdleTimeout), AuthTimeout: disabledIfZero(a.cfg.AuthTimeout)})
	if err != nil {
		return err
	}
	a.srv = srv
	if a.ln, err = net.Listen("tcp", a.cfg.Addr); err != nil {
		return flagErr("--addr", "listening on %s: %w", a.cfg.Addr, err)
	}
	if a.password == "" && !isLoopback(a.ln.Addr()) {
		a.log.Warn("serving the Redis protocol beyond loopback without a password: anyone who reaches this address can read, overwrite and delete blocks; set --password-file or OASIS_KVCACHED_PASSWORD", "addr", a.ln.Addr().String())
	}
	return nil
}

// readPassword reads the password from path. An empty file is an error
// rather than "no password": a Nomad template whose variable lacks the item
// renders an empty file, and starting without a password then would open
// the store to anyone who reaches it.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading password file: %w", err)
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", fmt.Errorf("password file %s is empty", path)
	}
	return p, nil
}
