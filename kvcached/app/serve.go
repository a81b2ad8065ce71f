package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Run serves the Redis protocol, the HTTP endpoints and peers until ctx
// ends or a server fails, then flushes the store's blocks to disk and
// closes the App.
func (a *App) Run(ctx context.Context) error {
	defer a.Close()
	if a.cfg.TuneRuntime {
		a.tuneRuntime(ctx)
	}
	a.startPeers()
	if a.presence != nil {
		a.bgWG.Add(1)
		go func() {
			defer a.bgWG.Done()
			_ = a.presence.Run(a.bg) // ends at Close
		}()
	}
	errc := make(chan error, 2)
	go func() { errc <- a.srv.Serve(a.ln) }()
	a.log.Info("serving the Redis protocol", "addr", a.ln.Addr().String(), "ram_bytes", a.cfg.RAMBytes,
		"ram_tier_bytes", a.plan.Tier, "inflight_bytes", a.plan.Inflight, "unauthenticated_bytes", a.plan.Unauth,
		"go_memory_limit", a.plan.GoLimit, "disk_bytes", a.cfg.DiskBytes, "auth", a.password != "")
	if a.http != nil {
		go func() { errc <- a.http.Serve(a.httpLn) }()
		a.log.Info("serving HTTP", "addr", a.httpLn.Addr().String())
	}
	return a.shutdown(ctx, errc)
}

// tuneRuntime sets the Go memory limit from the memory plan and, unless
// GOGC is set, keeps the heap goal at the live heap plus the plan's
// headroom (tuneGC): every large SET allocates its value, and a fixed GC
// percent either collects every few MiB of them when little is stored (a
// large share of 1 MiB SET throughput at Go's default) or lets the heap grow
// by GiBs of fresh, page-faulted memory when much is.
func (a *App) tuneRuntime(ctx context.Context) {
	debug.SetMemoryLimit(a.plan.GoLimit)
	if os.Getenv("GOGC") == "" {
		tuneGC(ctx, a.plan.Headroom-a.plan.Pool-a.plan.Unauth)
	}
}

// shutdown waits for the end (ctx, or a server that stopped), stops the
// Redis server and flushes the store's blocks to disk; Run's Close follows.
func (a *App) shutdown(ctx context.Context, errc <-chan error) error {
	var err error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down")
	case err = <-errc:
	}
	a.srv.Close()
	fctx, cancel := context.WithTimeout(context.Background(), shutdownFlushTimeout)
	defer cancel()
	if ferr := a.store.Flush(fctx); ferr != nil {
		a.log.Warn("flushing blocks to disk before exit", "error", ferr)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}

// initHTTP binds --http-addr for /metrics, /health and, with --pprof, Go's
// profiles.
func (a *App) initHTTP() error {
	if a.cfg.HTTPAddr == "" {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	if a.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		s := a.store.Stats()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"status":"ok","ram_blocks":%d,"disk_blocks":%d,"disk_degraded":%t}`+"\n", s.RAMBlocks, s.DiskBlocks, s.DiskDegraded)
	})
	var err error
	if a.httpLn, err = net.Listen("tcp", a.cfg.HTTPAddr); err != nil {
		return flagErr("--http-addr", "listening on %s: %w", a.cfg.HTTPAddr, err)
	}
	a.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// disabledIfZero maps a Config's 0 (disabled) to server.Config's negative
// (disabled), whose 0 means the default.
func disabledIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// isLoopback reports whether a listener's address is reachable only from
// this host.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
