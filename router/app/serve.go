package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// initServer binds the listener and builds the API's HTTP server.
//
// No ReadTimeout or WriteTimeout: answers stream for minutes, and a
// server-wide read deadline that fires while a handler runs cancels its
// request. Headers must arrive within ReadHeaderTimeout (which also bounds
// the TLS handshake); the gateway bounds the body's arrival itself
// (Config.BodyReadTimeout).
func (a *App) initServer() error {
	if err := a.initMeshServer(); err != nil {
		return err
	}
	if a.cfg.Listen == ListenOff {
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return flagErr("-listen", "%w", err)
	}
	// Past the cap, idle connections make room (connlimit.go); when none
	// is idle, connections wait in the kernel's accept queue: each served
	// one costs goroutines and buffers, and under a flood the router keeps
	// serving the ones it has.
	var lim *connLimiter
	if a.cfg.MaxConnections > 0 || a.cfg.MaxConnectionsPerSource > 0 {
		lim = newConnLimiter(ln, a.cfg.MaxConnections, a.cfg.MaxConnectionsPerSource, a.m)
		ln = lim
	}
	a.ln = ln
	a.srv = a.newHTTPServer("http")
	if lim != nil {
		a.srv.ConnState = lim.connState
	}
	if a.tls != nil {
		tc := a.tls.ServerConfig()
		// Set here, not left to http.Server: with mutual TLS every
		// handshake gets a copy of tc, which must offer them itself.
		tc.NextProtos = []string{"h2", "http/1.1"}
		a.srv.TLSConfig = tc
	}
	return nil
}

// serverLog writes net/http's server errors to hclog: failed TLS handshakes
// (scanners, clients without a certificate) at debug, the rest as warnings.
type serverLog struct{ log hclog.Logger }

func (s serverLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if strings.Contains(msg, "TLS handshake error") {
		s.log.Debug(msg)
	} else {
		s.log.Warn(msg)
	}
	return len(p), nil
}

// Run serves until ctx ends or serving fails, then drains: /ready turns
// 503, the router leaves Consul, and the server stops accepting and waits up
// to ShutdownTimeout for in-flight requests (streams included) to finish.
// Background work stops after that, and the App is closed.
func (a *App) Run(ctx context.Context) error {
	defer a.Close()
	a.startBackground()
	if a.cfg.PprofListen != "" {
		stop := a.servePprof()
		defer stop()
	}
	errc := make(chan error, 2)
	a.serve(errc)
	a.serveMesh(errc)
	serviceID, err := a.register()
	if err != nil {
		a.closeServers()
		return err
	}
	select {
	case err := <-errc:
		a.deregister(serviceID)
		a.closeServers()
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	return a.drain(serviceID, errc)
}

// serve serves the plain/TLS listener, when there is one.
func (a *App) serve(errc chan<- error) {
	if a.srv == nil {
		return
	}
	go func() {
		var err error
		if a.tls != nil {
			err = a.srv.ServeTLS(a.ln, "", "")
		} else {
			err = a.srv.Serve(a.ln)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	a.log.Info("serving", "listen", a.ln.Addr().String(), "tls", a.tls != nil, "mutual_tls", a.cfg.TLSClientCA != "",
		"discovery", a.cfg.Discovery, "api_keys", a.auth != nil)
	if a.auth == nil && !isLoopback(a.ln.Addr()) {
		a.log.Warn("API keys are disabled and the router listens beyond loopback", "listen", a.ln.Addr().String())
	}
}

// servers are the HTTP servers in use.
func (a *App) servers() []*http.Server {
	var out []*http.Server
	for _, s := range []*http.Server{a.srv, a.meshSrv} {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

func (a *App) closeServers() {
	for _, s := range a.servers() {
		s.Close()
	}
}

// drain stops taking requests and waits for the ones in flight.
func (a *App) drain(serviceID string, errc <-chan error) error {
	a.log.Info("shutting down; draining in-flight requests", "timeout", a.cfg.ShutdownTimeout)
	// Leave Consul first so that no new traffic arrives.
	a.gw.Drain()
	a.deregister(serviceID)
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range a.servers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Shutdown(sctx)
		}()
	}
	wg.Wait()
	select {
	case serr := <-errc:
		a.log.Warn("server stopped with an error", "error", serr)
	default:
	}
	if err := errors.Join(errs...); err != nil {
		a.closeServers() // what is still running is cut
		return fmt.Errorf("draining: %w", err)
	}
	a.log.Info("drained")
	return nil
}

// servePprof serves net/http/pprof on PprofListen; stop closes it.
func (a *App) servePprof() (stop func()) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	dbg := &http.Server{Addr: a.cfg.PprofListen, Handler: mux, ReadHeaderTimeout: readHeaderTimeout}
	go func() { a.log.Info("pprof stopped", "addr", a.cfg.PprofListen, "error", dbg.ListenAndServe()) }()
	return func() { dbg.Close() }
}

func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
