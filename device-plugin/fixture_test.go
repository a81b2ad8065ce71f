package deviceplugin

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/device-plugin/pluginclient"
	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// Values the fixture's GPUs report, in NVML units.
const (
	fxPowerMW      = 250_500     // 250.5 W
	fxLimitMW      = 400_000     // 400 W
	fxEnergyMJ     = 123_456_789 // 123456.789 J
	fxMemUsed      = 1 << 30     // 1024 MiB
	fxBAR1Total    = 64 << 30    // 65536 MiB
	fxBAR1Used     = 10 << 20    // 10 MiB
	fxTempC        = 61          //
	fxSMClockMHz   = 1410        //
	fxMaxGfxMHz    = 1410        //
	fxMaxMemMHz    = 1215        //
	fxECCCorrected = 3           //
	fxReasons      = 4 | 64      // sw_power_cap, hw_thermal_slowdown
	fxModel        = "Mock NVIDIA A100-SXM4-40GB"
)

// gpuState holds what a fixture GPU answers that tests change while the
// plugin runs; atomics keep the race detector quiet.
type gpuState struct {
	lost    atomic.Bool   // every query but GetUUID returns ERROR_GPU_IS_LOST
	powerMW atomic.Uint32 // GetPowerUsage
	reasons atomic.Uint64 // GetCurrentClocksEventReasons
}

func (s *gpuState) ret() nvml.Return {
	if s.lost.Load() {
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}

// quietDevice forwards the argument-taking calls the plugin makes straight
// to the mock's funcs: moq records every call's arguments, which would grow
// without bound over the 10,000-pass growth check.
type quietDevice struct{ *dgxa100.Device }

func (d quietDevice) GetClockInfo(c nvml.ClockType) (uint32, nvml.Return) {
	return d.GetClockInfoFunc(c)
}
func (d quietDevice) GetMaxClockInfo(c nvml.ClockType) (uint32, nvml.Return) {
	return d.GetMaxClockInfoFunc(c)
}
func (d quietDevice) GetTemperature(s nvml.TemperatureSensors) (uint32, nvml.Return) {
	return d.GetTemperatureFunc(s)
}
func (d quietDevice) GetTotalEccErrors(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	return d.GetTotalEccErrorsFunc(t, c)
}
func (d quietDevice) RegisterEvents(mask uint64, set nvml.EventSet) nvml.Return {
	return d.RegisterEventsFunc(mask, set)
}
func (d quietDevice) GetMigDeviceHandleByIndex(i int) (nvml.Device, nvml.Return) {
	return d.GetMigDeviceHandleByIndexFunc(i)
}

// fixture is a DGX A100 from go-nvml's mock with every NVML call the plugin
// makes answered, plus an event channel behind its event set.
type fixture struct {
	srv    *dgxa100.Server
	gpus   []*dgxa100.Device
	state  []*gpuState
	events chan nvml.EventData
	// waitErrs makes the event set's Wait fail with these codes.
	waitErrs chan nvml.Return
	// lostHandle makes DeviceGetHandleByIndex fail with ERROR_GPU_IS_LOST
	// for this index (-1: none).
	lostHandle atomic.Int32
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	fx := &fixture{srv: dgxa100.New(), events: make(chan nvml.EventData, 16), waitErrs: make(chan nvml.Return, 4)}
	fx.lostHandle.Store(-1)
	for i := range fx.srv.Devices {
		d := fx.srv.Devices[i].(*dgxa100.Device)
		st := &gpuState{}
		st.powerMW.Store(fxPowerMW)
		st.reasons.Store(fxReasons)
		fx.gpus = append(fx.gpus, d)
		fx.state = append(fx.state, st)
		fx.srv.Devices[i] = quietDevice{d}
		d.MemoryInfo.Used = fxMemUsed
		d.MemoryInfo.Free = d.MemoryInfo.Total - fxMemUsed

		d.GetNameFunc = func() (string, nvml.Return) { return d.Name, st.ret() }
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return d.MemoryInfo, st.ret() }
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			copy(p.BusId[:], d.PciBusID)
			return p, st.ret()
		}
		d.GetBAR1MemoryInfoFunc = func() (nvml.BAR1Memory, nvml.Return) {
			return nvml.BAR1Memory{Bar1Total: fxBAR1Total, Bar1Used: fxBAR1Used, Bar1Free: fxBAR1Total - fxBAR1Used}, st.ret()
		}
		d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return fxLimitMW, st.ret() }
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return st.powerMW.Load(), st.ret() }
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return fxEnergyMJ, st.ret() }
		d.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			if c == nvml.CLOCK_MEM {
				return fxMaxMemMHz, st.ret()
			}
			return fxMaxGfxMHz, st.ret()
		}
		d.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return fxSMClockMHz, st.ret() }
		d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return 4, st.ret() }
		d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return 16, st.ret() }
		d.GetDisplayModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, st.ret() }
		d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, st.ret() }
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: 87, Memory: 42}, st.ret()
		}
		d.GetEncoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return 0, 1000, st.ret() }
		d.GetDecoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return 5, 1000, st.ret() }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return fxTempC, st.ret() }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return st.reasons.Load(), st.ret() }
		d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
			if t == nvml.MEMORY_ERROR_TYPE_CORRECTED {
				return fxECCCorrected, st.ret()
			}
			return 0, st.ret()
		}
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, st.ret()
		}
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return st.ret() }
		migMode := d.GetMigModeFunc
		d.GetMigModeFunc = func() (int, int, nvml.Return) {
			if st.lost.Load() {
				return 0, 0, nvml.ERROR_GPU_IS_LOST
			}
			return migMode()
		}
	}
	byIndex := fx.srv.DeviceGetHandleByIndexFunc
	fx.srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if int32(i) == fx.lostHandle.Load() {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return byIndex(i)
	}
	fx.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				select {
				case e := <-fx.events:
					return e, nvml.SUCCESS
				case ret := <-fx.waitErrs:
					return nvml.EventData{}, ret
				case <-time.After(time.Duration(ms) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return fx
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
