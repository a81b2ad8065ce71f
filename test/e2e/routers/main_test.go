// Package routers tests the routers of one datacenter together, as the
// Nomad system job runs them (one per node): three oasis-router processes
// registered in a real Consul agent, sharing admission and key limits over
// their gossip (router/peers), in front of one counting engine.
package routers

import (
	"os"
	"testing"

	"github.com/oasis-llm/oasis/internal/testutil"
)

var routerBin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithCommand(m, "github.com/oasis-llm/oasis/cmd/oasis-router", &routerBin))
}
