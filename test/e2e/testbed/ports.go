package testbed

import (
	"fmt"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// Nomad hands out a client's dynamic ports without knowing what another agent on the machine
// handed out: two stacks on 127.0.0.1 (`make test` runs two e2e packages at a time) could give two
// tasks the same port, and the second task would fail to bind. Each stack's client therefore takes
// a window of Nomad's default dynamic range (20000-31999, below the kernel's ephemeral ports and
// above the 10000-19999 testutil.FreePorts hands out) that no other stack on the machine holds:
// testutil.PortWindows, one flock'ed lock file per window, held until the stack closes or its
// process ends.
func dynamicPortWindows() testutil.PortWindows {
	return testutil.PortWindows{Name: "testbed-ports", Min: 20000, Width: 1000, Count: 12}
}

// nomadDynamicPorts is the Nomad client block's dynamic port range: the window w.
func nomadDynamicPorts(w *testutil.PortWindow) string {
	return fmt.Sprintf("  min_dynamic_port = %d\n  max_dynamic_port = %d\n", w.Min, w.Max)
}
