// Package node provisions a GPU node the way terraform/modules/nomad-gpu-client describes it,
// on the real test bed: tofu renders the module for temporary directories and loopback ports,
// the files its cloud-init user-data writes are written with their modes, its install script
// installs a scripts/dist.sh tarball served over HTTP, and the rendered agent configurations run a
// real Consul client agent and a second real Nomad client that joins the stack's servers and runs
// the sim recipe.
package node

import (
	"os"
	"testing"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }
