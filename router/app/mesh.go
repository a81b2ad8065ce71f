package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/router/gateway"
)

// ListenOff as -listen serves no plain/TLS listener: only mesh clients
// (-mesh-listen) reach the router.
const ListenOff = "off"

// meshStartTimeout bounds the wait for the first Connect leaf and roots.
const meshStartTimeout = 30 * time.Second

// validateMesh checks the service-mesh flags.
func (c Config) validateMesh() error {
	if c.MeshService == "" {
		for _, f := range []struct {
			flag string
			set  bool
		}{{"-mesh-listen", c.MeshListen != ""}, {"-mesh-engines", c.MeshEngines}} {
			if f.set {
				return flagErr(f.flag, "needs -mesh-service (the router's identity in the mesh)")
			}
		}
		if c.Listen == ListenOff {
			return flagErr("-listen", "off needs -mesh-listen: the router would serve nobody")
		}
		return nil
	}
	if c.Listen == ListenOff && c.MeshListen == "" {
		return flagErr("-listen", "off needs -mesh-listen: the router would serve nobody")
	}
	if c.MeshListen != "" {
		if err := checkHostPort(c.MeshListen); err != nil {
			return flagErr("-mesh-listen", "%w", err)
		}
	}
	if c.MeshEngines && c.Discovery != DiscoveryConsul {
		return flagErr("-mesh-engines", "needs -discovery=consul (sidecar addresses come from Consul)")
	}
	return nil
}

// initMesh gets the router's Connect identity from the local Consul agent.
func (a *App) initMesh() error {
	if a.cfg.MeshService == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), meshStartTimeout)
	defer cancel()
	id, err := meshid.New(ctx, meshid.Config{Consul: a.consul, Service: a.cfg.MeshService,
		Logger: a.log, Registerer: a.reg, Namespace: "oasis_router", OnOutboundChange: a.meshIntentionsChanged})
	if err != nil {
		return flagErr("-mesh-service", "%w", err)
	}
	a.mesh = id
	return nil
}

// meshIntentionsChanged follows a change of the intentions naming the
// router as source: sidecars authorize a connection once, at its handshake,
// so pooled connections made under an intention since removed would keep
// working. Idle ones are dropped; streams in flight finish. (Peer routers
// authorize every forwarded request themselves: the federation link keeps
// its connections.)
func (a *App) meshIntentionsChanged() {
	if e := a.enginesReady.Load(); e != nil {
		e.CloseIdleConnections()
		a.log.Info("intentions from the router changed; idle engine connections closed")
	}
}

// engineTLS is the TLS the engine transport wraps connections in: the
// router's mesh identity, accepting only the engine service's, with
// -mesh-engines; none otherwise.
func (a *App) engineTLS() *tls.Config {
	if !a.cfg.MeshEngines {
		return nil
	}
	return a.mesh.ClientConfig(a.cfg.Service)
}

// initMeshServer binds the Connect-native listener: the same API, for
// callers with a mesh certificate whose intentions allow them.
func (a *App) initMeshServer() error {
	if a.cfg.MeshListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.MeshListen)
	if err != nil {
		return flagErr("-mesh-listen", "%w", err)
	}
	a.meshLn = ln
	a.meshSrv = a.newHTTPServer("http.mesh")
	a.meshSrv.Handler = gateway.RequirePeer(a.gw, a.mesh.Authorize)
	a.meshSrv.TLSConfig = a.mesh.ServerConfig("h2", "http/1.1")
	return nil
}

// serveMesh serves the mesh listener until it is shut down.
func (a *App) serveMesh(errc chan<- error) {
	if a.meshSrv == nil {
		return
	}
	go func() {
		err := a.meshSrv.ServeTLS(a.meshLn, "", "")
		if !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("mesh listener: %w", err)
		}
	}()
	a.log.Info("serving the service mesh", "listen", a.meshLn.Addr().String(), "service", a.cfg.MeshService,
		"trust_domain", a.mesh.TrustDomain())
}

// newHTTPServer is the API's HTTP server, for one listener.
func (a *App) newHTTPServer(logName string) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true) // over TLS by ALPN only: unencrypted HTTP/2 stays off
	return &http.Server{
		Handler:           a.gw,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    a.cfg.MaxHeaderBytes,
		Protocols:         &protocols,
		ErrorLog:          log.New(serverLog{a.log.Named(logName)}, "", 0),
	}
}
