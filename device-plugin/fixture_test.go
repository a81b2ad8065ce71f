package deviceplugin

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/device-plugin/pluginclient"
	"github.com/oasis-llm/oasis/internal/mocknvml"
	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// Values the fixture's GPUs report, in NVML units.
const (
	fxPowerMW      = mocknvml.PowerMW
	fxLimitMW      = mocknvml.LimitMW
	fxEnergyMJ     = mocknvml.EnergyMJ
	fxMemUsed      = mocknvml.MemUsed
	fxBAR1Total    = mocknvml.BAR1Total
	fxBAR1Used     = mocknvml.BAR1Used
	fxTempC        = mocknvml.TempC
	fxSMClockMHz   = mocknvml.SMClockMHz
	fxMaxGfxMHz    = mocknvml.MaxGfxMHz
	fxMaxMemMHz    = mocknvml.MaxMemMHz
	fxECCCorrected = mocknvml.ECCCorrected
	fxReasons      = mocknvml.Reasons
	fxModel        = mocknvml.Model
)

// fixture is mocknvml's DGX A100 under the short names the tests use.
type fixture struct {
	srv    *dgxa100.Server
	gpus   []*dgxa100.Device
	state  []*mocknvml.GPUState
	events chan nvml.EventData
	// waitErrs makes the event set's Wait fail with these codes.
	waitErrs chan nvml.Return
	// lostHandle makes DeviceGetHandleByIndex fail with ERROR_GPU_IS_LOST
	// for this index (-1: none).
	lostHandle *atomic.Int32
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	m := mocknvml.New()
	return &fixture{srv: m.Server, gpus: m.GPUs, state: m.State, events: m.Events, waitErrs: m.WaitErrs, lostHandle: &m.LostHandle}
}

// newTestPlugin returns a plugin on lib configured with cfg (the plugin
// block's config, encoded as Nomad's plugin loader does) and its log.
func newTestPlugin(t testing.TB, lib nvml.Interface, cfg map[string]any) (*Plugin, *testutil.SyncBuffer) {
	t.Helper()
	logs := &testutil.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
	p := New(logger, lib)
	p.eventWait = 20 * time.Millisecond
	buf, err := pluginclient.EncodeConfig(configSpec, cfg)
	must.NoError(t, err)
	must.NoError(t, p.SetConfig(&base.Config{PluginConfig: buf}))
	return p, logs
}

// startFingerprint starts a fingerprint stream that ends with the test.
func startFingerprint(t testing.TB, p device.DevicePlugin) <-chan *device.FingerprintResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := p.Fingerprint(ctx)
	must.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		for range ch { // drain until the loop has exited
		}
	})
	return ch
}

// nextFingerprint waits for the next fingerprint.
func nextFingerprint(t testing.TB, ch <-chan *device.FingerprintResponse) *device.FingerprintResponse {
	t.Helper()
	select {
	case f, ok := <-ch:
		must.True(t, ok, must.Sprint("fingerprint stream closed"))
		must.NoError(t, f.Error)
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no fingerprint within 5s")
		return nil
	}
}

// noFingerprint asserts nothing arrives for d.
func noFingerprint(t testing.TB, ch <-chan *device.FingerprintResponse, d time.Duration) {
	t.Helper()
	select {
	case f, ok := <-ch:
		if !ok {
			t.Fatal("fingerprint stream closed")
		}
		t.Fatalf("unexpected fingerprint: %d groups", len(f.Devices))
	case <-time.After(d):
	}
}

// deviceByID finds a device in a fingerprint.
func deviceByID(f *device.FingerprintResponse, id string) *device.Device {
	for _, g := range f.Devices {
		for _, d := range g.Devices {
			if d.ID == id {
				return d
			}
		}
	}
	return nil
}
