// Package faults breaks the parts Oasis depends on while it serves load, on
// the real Nomad + Consul test bed: engines stopped and killed, the Nomad
// client agent restarted, kvcached killed. Every test states what was lost
// (requests, blocks) and asserts the bound.
package faults

import (
	"os"
	"testing"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }
