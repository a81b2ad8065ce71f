package testutil

import (
	"slices"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// StartConsulWANPair runs two Consul dev agents, datacenters dc1 (primary)
// and dc2, WAN-federated on loopback, for the duration of the test, and
// waits until each lists both datacenters and has a leader. Cross-DC
// queries (?dc=) work from either side. Without a consul binary the test is
// skipped (failed under CI).
func StartConsulWANPair(t testing.TB) (dc1, dc2 *ConsulAgent) {
	t.Helper()
	ports, err := FreePorts(8)
	must.NoError(t, err)
	agent := func(dc string, p []int, extra map[string]any) *ConsulAgent {
		extra["datacenter"] = dc
		extra["primary_datacenter"] = "dc1"
		extra["ports"] = map[string]int{"serf_wan": p[3]}
		return startConsulAgent(t, consulAgentConfig{name: "consul-" + dc, http: p[0], serfLAN: p[1], server: p[2],
			extra: extra}, "-dev")
	}
	dc1 = agent("dc1", ports[:4], map[string]any{})
	dc2 = agent("dc2", ports[4:], map[string]any{"retry_join_wan": []string{loopback(ports[3])},
		"retry_interval_wan": "1s"})
	for _, a := range []*ConsulAgent{dc1, dc2} {
		a.waitFor(t, 60*time.Second, "a leader and both datacenters", func() bool {
			leader, err := a.Client.Status().Leader()
			dcs, derr := a.Client.Catalog().Datacenters()
			return err == nil && leader != "" && derr == nil && slices.Contains(dcs, "dc1") && slices.Contains(dcs, "dc2")
		})
	}
	return dc1, dc2
}
