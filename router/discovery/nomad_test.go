package discovery

import (
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

func TestInterpolateMetaFromAllocation(t *testing.T) {
	alloc := &nomadapi.Allocation{AllocatedResources: &nomadapi.AllocatedResources{
		Shared: nomadapi.AllocatedSharedResources{Ports: []nomadapi.PortMapping{
			{Label: "http", Value: 23001, HostIP: "10.0.0.5"},
			{Label: "kv_events", Value: 23002, HostIP: "10.0.0.5"},
			{Label: "bridged", Value: 23003, To: 5557, HostIP: "10.0.0.5"},
		}},
		Tasks: map[string]*nomadapi.AllocatedTaskResources{"engine": {Networks: []*nomadapi.NetworkResource{{
			IP: "10.0.0.6", DynamicPorts: []nomadapi.Port{{Label: "legacy", Value: 24000}},
		}}}},
	}}
	vars := allocVars(alloc, "node-1")
	for _, tc := range []struct{ in, want string }{
		{"tcp://${NOMAD_ADDR_kv_events}", "tcp://10.0.0.5:23002"},
		{"tcp://${NOMAD_IP_kv_events}:${NOMAD_PORT_kv_events}", "tcp://10.0.0.5:23002"},
		{"${NOMAD_PORT_bridged}/${NOMAD_HOST_PORT_bridged}", "5557/23003"},
		{"${NOMAD_HOST_ADDR_bridged}", "10.0.0.5:23003"},
		{"${NOMAD_ADDR_legacy}", "10.0.0.6:24000"},
		{"${node.unique.id}", "node-1"},
		{"plain", "plain"},
		{"", ""},
		// Unknown names stay, so the caller can refuse the value.
		{"tcp://${NOMAD_ADDR_missing}", "tcp://${NOMAD_ADDR_missing}"},
		{"${attr.unique.network.ip-address}:${NOMAD_PORT_http}", "${attr.unique.network.ip-address}:23001"},
		{"unterminated ${NOMAD_ADDR_http", "unterminated ${NOMAD_ADDR_http"},
	} {
		must.Eq(t, tc.want, interpolateMeta(tc.in, vars), must.Sprintf("input %q", tc.in))
	}
}

func TestAllocVarsWithoutResources(t *testing.T) {
	vars := allocVars(&nomadapi.Allocation{}, "n")
	must.Eq(t, map[string]string{"node.unique.id": "n"}, vars)
}
