package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/oasis-llm/oasis/internal/meshid"
)

// meshClient is routerload as a service in the Consul service mesh: the
// Connect leaf and roots from the local agent, followed as the router
// follows its own (internal/meshid), so mesh targets are called as a
// Connect-native application would call them.
type meshClient struct{ id *meshid.Identity }

func newMeshClient(addr, service string) (*meshClient, error) {
	cfg := consulapi.DefaultConfig()
	if addr != "" {
		cfg.Address = addr
	}
	c, err := consulapi.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("-mesh-consul: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := meshid.New(ctx, meshid.Config{Consul: c, Service: service})
	if err != nil {
		return nil, fmt.Errorf("-mesh-service: %w", err)
	}
	return &meshClient{id: id}, nil
}

func (m *meshClient) Close() { m.id.Close() }

// clientTLS presents the leaf and accepts the server only as service, with
// the same ALPN offer as clientTLS for the other targets.
func (m *meshClient) clientTLS(service string, h2 bool) *tls.Config {
	if h2 {
		return m.id.ClientConfig(service, "h2", "http/1.1")
	}
	return m.id.ClientConfig(service, "http/1.1")
}

// parseMeshTargets reads -mesh-targets: name=service,...
func parseMeshTargets(s string) (map[string]string, error) {
	m := map[string]string{}
	if s == "" {
		return m, nil
	}
	for _, e := range strings.Split(s, ",") {
		name, svc, ok := strings.Cut(e, "=")
		if !ok || name == "" || svc == "" {
			return nil, fmt.Errorf("bad -mesh-targets entry: %s", e)
		}
		m[name] = svc
	}
	return m, nil
}
