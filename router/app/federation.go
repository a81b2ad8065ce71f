package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/internal/tlsfiles/pki"
	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/policy"
)

// validateFederation checks the federation flags that need no file or network.
func (c Config) validateFederation() error {
	if c.FederationListen == "" {
		for _, f := range []struct{ flag, v string }{{"-federation-tls-cert", c.FederationTLSCert},
			{"-federation-tls-key", c.FederationTLSKey}, {"-federation-tls-ca", c.FederationTLSCA},
			{"-federation-dc", c.FederationDC}, {"-federation-advertise", c.FederationAdvertise}} {
			if f.v != "" {
				return flagErr(f.flag, "only used with -federation-listen")
			}
		}
		return nil
	}
	if err := checkHostPort(c.FederationListen); err != nil {
		return flagErr("-federation-listen", "%w", err)
	}
	if c.FederationAdvertise != "" {
		if err := checkHostPort(c.FederationAdvertise); err != nil {
			return flagErr("-federation-advertise", "%w", err)
		}
	}
	for _, f := range []struct{ flag, v string }{{"-federation-tls-cert", c.FederationTLSCert},
		{"-federation-tls-key", c.FederationTLSKey}, {"-federation-tls-ca", c.FederationTLSCA}} {
		switch {
		case f.v == "" && c.MeshService == "":
			return flagErr(f.flag, "required with -federation-listen (peers authenticate each other by certificate) unless -mesh-service gives the router its identity")
		case f.v != "" && c.MeshService != "":
			return flagErr(f.flag, "not with -mesh-service: the federation uses the router's mesh identity")
		}
	}
	return nil
}

// initFederation builds the federation, bound to its UDP listener. It is
// built before the gateway, which it serves (forwarded requests) and reads
// (summaries) once both exist.
func (a *App) initFederation() error {
	c := a.cfg
	if c.FederationListen == "" {
		return nil
	}
	dc, err := a.federationDC()
	if err != nil {
		return err
	}
	id, err := a.federationIdentity(dc)
	if err != nil {
		return err
	}
	a.fed, err = federation.New(federation.Config{DC: dc, Consul: a.consul, Identity: id,
		Listen: c.FederationListen, Logger: a.log, Registerer: a.reg,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.forwarded.ServeHTTP(w, r) }),
		Policy:  func() policy.FederationSettings { return a.policy.Current().FederationSettings() },
		Local:   func() []federation.ModelSummary { return a.gw.FederationSummary() }})
	if err != nil {
		if errors.Is(err, federation.ErrNoDC) {
			return flagErr("-federation-dc", "%w", err)
		}
		return flagErr("-federation-listen", "%w", err)
	}
	return nil
}

// federationIdentity is the router's mesh identity with -mesh-service, the
// -federation-tls-* files otherwise.
func (a *App) federationIdentity(dc string) (federation.Identity, error) {
	c := a.cfg
	if a.mesh != nil {
		// Peers are the other datacenters' routers, in the mesh as MeshService.
		return federation.MeshIdentity(a.mesh, a.cfg.MeshService), nil
	}
	files, err := tlsfiles.New(tlsfiles.Config{CertFile: c.FederationTLSCert, KeyFile: c.FederationTLSKey,
		ClientCAFile: c.FederationTLSCA, Logger: a.log.Named("federation.tls"), Registerer: a.reg,
		Namespace: "oasis_router_federation"})
	if err != nil {
		var fe *tlsfiles.FileError
		if errors.As(err, &fe) {
			return federation.Identity{}, &ConfigError{Flag: map[string]string{"CertFile": "-federation-tls-cert",
				"KeyFile": "-federation-tls-key", "ClientCAFile": "-federation-tls-ca"}[fe.Field], Err: err}
		}
		return federation.Identity{}, fmt.Errorf("federation TLS: %w", err)
	}
	id, err := federation.FilesIdentity(files)
	if err != nil {
		return federation.Identity{}, flagErr("-federation-tls-cert", "%w", err)
	}
	// Peers take a datacenter's summaries and requests only from a
	// certificate that names it: say so now rather than be refused by all.
	if got := federation.CertificateDC(files.Certificate()); got != dc {
		return federation.Identity{}, flagErr("-federation-tls-cert",
			"the certificate names datacenter %q, not this router's %q: it needs the URI SAN %s (internal/tlsfiles/pki.IssueRouter makes one)",
			got, dc, pki.RouterURI(dc))
	}
	return id, nil
}

// federationDC is -federation-dc or, without it, the local Consul agent's.
func (a *App) federationDC() (string, error) {
	if a.cfg.FederationDC != "" {
		return a.cfg.FederationDC, nil
	}
	if a.consul == nil {
		return "", flagErr("-federation-dc", "required without Consul")
	}
	self, err := a.consul.Agent().Self()
	if err != nil {
		return "", flagErr("-federation-dc", "not set, and asking the Consul agent failed: %w", err)
	}
	dc, _ := self["Config"]["Datacenter"].(string)
	if dc == "" {
		return "", flagErr("-federation-dc", "not set, and the Consul agent names no datacenter")
	}
	return dc, nil
}

// registerFederation keeps service federation.Service registered with this
// router's datacenter and models in its meta while the background runs:
// other datacenters' routers find it there. Meta is rewritten when the
// models change; the check is the API listener's (HTTP/3 has no Consul
// check).
func (a *App) registerFederation(check *consulapi.AgentServiceCheck) {
	adv := a.cfg.FederationAdvertise
	if adv == "" {
		adv = a.fed.Addr().String()
	}
	host, portS, _ := net.SplitHostPort(adv)
	port, _ := strconv.Atoi(portS)
	id := federation.Service + "-" + strings.NewReplacer(":", "-", ".", "-").Replace(adv)
	// A router with no engine registers too, without models: peers push
	// their summaries only to routers they find, and it needs them to
	// forward its own requests (no local worker).
	last, registered := "", false
	for {
		models := a.pool.Models()
		slices.Sort(models)
		if key := strings.Join(models, ","); key != last || !registered {
			m := map[string]string{federation.MetaDC: a.fed.DC()}
			if dropped := federation.ModelsMeta(m, models); dropped > 0 {
				a.log.Warn("more models than the federation registration's meta holds: the last ones are not announced to other datacenters",
					"models", len(models), "not_announced", dropped)
			}
			err := a.consul.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{ID: id, Name: federation.Service,
				Address: host, Port: port, Tags: []string{"oasis"}, Check: check, Meta: m})
			if err != nil {
				a.log.Warn("registering the federation listener in Consul failed", "error", err)
			} else {
				last, registered = key, true
			}
		}
		select {
		case <-a.bg.Done():
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = a.consul.Agent().ServiceDeregisterOpts(id, (&consulapi.QueryOptions{}).WithContext(ctx))
			return
		case <-time.After(time.Second):
		}
	}
}
