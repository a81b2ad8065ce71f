package driver

import (
	"context"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
)

// TestNetNSPath: only group isolation (bridge, cni/*) moves the engine and its health probe
// into the allocation's namespace.
func TestNetNSPath(t *testing.T) {
	cases := []struct {
		name string
		ni   *drivers.NetworkIsolationSpec
		want string
	}{
		{"host networking", nil, ""},
		{"host mode spec", &drivers.NetworkIsolationSpec{Mode: drivers.NetIsolationModeHost, Path: "/var/run/netns/x"}, ""},
		{"group", &drivers.NetworkIsolationSpec{Mode: drivers.NetIsolationModeGroup, Path: "/var/run/netns/a1"}, "/var/run/netns/a1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.EqOp(t, tc.want, netNSPath(&drivers.TaskConfig{NetworkIsolation: tc.ni}))
		})
	}
}

// TestNamespaceHealthClientMissingNamespace: a probe into a namespace that is gone fails with
// the path in the error, so the health event says why.
func TestNamespaceHealthClientMissingNamespace(t *testing.T) {
	c := newTestDriver(t).newNamespaceHealthClient("/var/run/netns/oasis-test-missing")
	_, err := c.Get("http://127.0.0.1:1/health")
	must.ErrorContains(t, err, "/var/run/netns/oasis-test-missing")
}

func TestCapabilitiesBridge(t *testing.T) {
	caps, err := newTestDriver(t).Capabilities()
	must.NoError(t, err)
	must.SliceContains(t, caps.NetIsolationModes, drivers.NetIsolationModeGroup)
	must.SliceContains(t, caps.NetIsolationModes, drivers.NetIsolationModeHost)
}

// newTestDriver is a driver without a harness; its background work ends with the test.
func newTestDriver(t *testing.T) *Driver {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return New(ctx, nil)
}
