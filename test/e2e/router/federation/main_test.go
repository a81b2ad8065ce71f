// Package federation tests router federation end to end: two oasis-router
// apps, each in front of its own oasis-sim engines and its own Consul dev
// agent, the two agents WAN-federated as two datacenters on loopback.
package federation

import (
	"os"
	"testing"

	"github.com/oasis-llm/oasis/internal/testutil"
)

var simBin string // built oasis-sim

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithCommand(m, "github.com/oasis-llm/oasis/cmd/oasis-sim", &simBin))
}
