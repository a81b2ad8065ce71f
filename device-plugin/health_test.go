package deviceplugin

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"
)

type atomicBool = atomic.Bool

func testLogger() hclog.Logger { return hclog.NewNullLogger() }

func TestHealth_XIDs(t *testing.T) {
	cases := []struct {
		name      string
		eventType uint64
		xid       uint64
		wantDesc  string // "" = stays healthy
	}{
		{"fallen off the bus", nvml.EventTypeXidCriticalError, 79, "critical Xid 79: GPU has fallen off the bus"},
		{"double-bit ECC Xid", nvml.EventTypeXidCriticalError, 48, "critical Xid 48: double-bit ECC error"},
		{"uncontained ECC", nvml.EventTypeXidCriticalError, 95, "critical Xid 95: uncontained ECC error"},
		{"GSP timeout", nvml.EventTypeXidCriticalError, 119, "critical Xid 119: GSP RPC timeout"},
		{"NVLink", nvml.EventTypeXidCriticalError, 74, "critical Xid 74: NVLink error"},
		{"double-bit ECC event", nvml.EventTypeDoubleBitEccError, 0, "double-bit ECC error event"},
		{"application MMU fault", nvml.EventTypeXidCriticalError, 31, ""},
		{"application graphics exception", nvml.EventTypeXidCriticalError, 13, ""},
		{"contained ECC", nvml.EventTypeXidCriticalError, 94, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			p, _ := newTestPlugin(t, fx.srv, nil)
			ch := startFingerprint(t, p)
			nextFingerprint(t, ch)

			fx.events <- nvml.EventData{Device: fx.srv.Devices[3], EventType: tc.eventType, EventData: tc.xid, GpuInstanceId: noInstance}
			if tc.wantDesc == "" {
				noFingerprint(t, ch, 200*time.Millisecond)
				return
			}
			f := nextFingerprint(t, ch)
			for _, g := range fx.gpus {
				d := deviceByID(f, g.UUID)
				if g.UUID == fx.gpus[3].UUID {
					must.False(t, d.Healthy)
					must.StrContains(t, d.HealthDesc, tc.wantDesc)
					continue
				}
				must.True(t, d.Healthy, must.Sprintf("%s must stay healthy", g.UUID))
			}
		})
	}
}

// A GPU that falls off the bus is marked unhealthy by the next stats pass,
// and healthy again (with its Xid mark cleared) once NVML answers again.
func TestHealth_LostAndRecovered(t *testing.T) {
	fx := newFixture(t)
	p, logs := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "20ms"})
	ch := startFingerprint(t, p)
	nextFingerprint(t, ch)
	id := fx.gpus[5].UUID

	fx.events <- nvml.EventData{Device: fx.srv.Devices[5], EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: noInstance}
	f := nextFingerprint(t, ch)
	must.False(t, deviceByID(f, id).Healthy)

	fx.state[5].Lost.Store(true)
	groups := p.collectStats(time.Now())
	must.MapLen(t, 7, groups[0].InstanceStats, must.Sprint("a lost GPU has no stats"))
	f = nextFingerprint(t, ch)
	d := deviceByID(f, id)
	must.NotNil(t, d, must.Sprint("a lost GPU stays listed"))
	must.False(t, d.Healthy)
	must.StrContains(t, d.HealthDesc, "ERROR_GPU_IS_LOST")
	must.StrContains(t, d.HealthDesc, "Xid 79")
	must.Eq(t, fxModel, f.Devices[0].Name, must.Sprint("a lost GPU keeps its last good name"))
	must.SliceLen(t, 1, f.Devices)

	_, err := p.Reserve([]string{id})
	must.NoError(t, err, must.Sprint("Nomad decides on health; a known id is reservable"))

	fx.state[5].Lost.Store(false)
	f = nextFingerprint(t, ch)
	d = deviceByID(f, id)
	must.True(t, d.Healthy)
	must.Eq(t, "", d.HealthDesc)
	must.StrContains(t, logs.String(), "GPU healthy again")
	groups = p.collectStats(time.Now())
	must.MapLen(t, 8, groups[0].InstanceStats)
}

// When NVML cannot even hand out the handle of a lost GPU, the GPU it knew
// stays listed as unhealthy rather than vanishing from the node.
func TestHealth_LostHandleKeepsDevice(t *testing.T) {
	fx := newFixture(t)
	p, _ := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "20ms"})
	ch := startFingerprint(t, p)
	nextFingerprint(t, ch)

	fx.lostHandle.Store(2)
	f := nextFingerprint(t, ch)
	must.SliceLen(t, 8, f.Devices[0].Devices)
	d := deviceByID(f, fx.gpus[2].UUID)
	must.False(t, d.Healthy)
	must.Eq(t, lostReason, d.HealthDesc)

	fx.lostHandle.Store(-1)
	f = nextFingerprint(t, ch)
	must.True(t, deviceByID(f, fx.gpus[2].UUID).Healthy)
}

// Without a lost handle, a GPU missing from NVML (unplugged, hidden) is
// removed from the fingerprint.
func TestHealth_RemovedGPUDropped(t *testing.T) {
	fx := newFixture(t)
	var count atomic.Int32
	count.Store(8)
	fx.srv.DeviceGetCountFunc = func() (int, nvml.Return) { return int(count.Load()), nvml.SUCCESS }
	p, _ := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "20ms"})
	ch := startFingerprint(t, p)
	nextFingerprint(t, ch)
	count.Store(7)
	f := nextFingerprint(t, ch)
	must.SliceLen(t, 7, f.Devices[0].Devices)
	must.Nil(t, deviceByID(f, fx.gpus[7].UUID))
}

func TestXIDReason(t *testing.T) {
	for xid := range criticalXIDs {
		must.StrHasPrefix(t, "critical Xid ", xidReason(xid))
	}
	for _, xid := range []uint64{13, 31, 43, 45, 68, 69, 94, 109} {
		must.Eq(t, "", xidReason(xid), must.Sprintf("xid %d is an application error", xid))
	}
}

// A failing rescan reports every known GPU unhealthy without forgetting
// them, and does not wash out an earlier Xid once NVML answers again.
func TestHealth_ScanErrorKeepsDevicesAndXID(t *testing.T) {
	fx := newFixture(t)
	var broken atomic.Bool
	fx.srv.DeviceGetCountFunc = func() (int, nvml.Return) {
		if broken.Load() {
			return 0, nvml.ERROR_UNKNOWN
		}
		return len(fx.srv.Devices), nvml.SUCCESS
	}
	p, logs := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "20ms"})
	ch := startFingerprint(t, p)
	nextFingerprint(t, ch)

	fx.events <- nvml.EventData{Device: fx.srv.Devices[1], EventType: nvml.EventTypeXidCriticalError, EventData: 48, GpuInstanceId: noInstance}
	nextFingerprint(t, ch)

	broken.Store(true)
	f := nextFingerprint(t, ch)
	must.SliceLen(t, 8, f.Devices[0].Devices)
	for _, d := range f.Devices[0].Devices {
		must.False(t, d.Healthy)
		must.StrContains(t, d.HealthDesc, "NVML query failed: counting GPUs: ERROR_UNKNOWN")
	}
	noFingerprint(t, ch, 100*time.Millisecond)

	broken.Store(false)
	f = nextFingerprint(t, ch)
	for _, g := range fx.gpus {
		d := deviceByID(f, g.UUID)
		if g.UUID == fx.gpus[1].UUID {
			must.False(t, d.Healthy)
			must.StrContains(t, d.HealthDesc, "critical Xid 48")
			must.StrNotContains(t, d.HealthDesc, "NVML query failed")
			continue
		}
		must.True(t, d.Healthy)
	}
	must.Eq(t, 1, strings.Count(logs.String(), "scanning GPUs failed"))
}

// When the event set itself reports a lost GPU (without saying which), the
// plugin rescans at once instead of waiting for the next period.
func TestHealth_EventSetLostTriggersRescan(t *testing.T) {
	fx := newFixture(t)
	p, _ := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "1h"})
	ch := startFingerprint(t, p)
	nextFingerprint(t, ch)

	fx.state[6].Lost.Store(true)
	fx.waitErrs <- nvml.ERROR_GPU_IS_LOST
	f := nextFingerprint(t, ch)
	d := deviceByID(f, fx.gpus[6].UUID)
	must.False(t, d.Healthy)
	must.Eq(t, lostReason, d.HealthDesc)

	// Other Wait errors are retried with back-off, not fatal: a later Xid
	// still arrives.
	fx.waitErrs <- nvml.ERROR_UNKNOWN
	fx.events <- nvml.EventData{Device: fx.srv.Devices[0], EventType: nvml.EventTypeXidCriticalError, EventData: 62, GpuInstanceId: noInstance}
	f = nextFingerprint(t, ch)
	must.StrContains(t, deviceByID(f, fx.gpus[0].UUID).HealthDesc, "critical Xid 62")
}
