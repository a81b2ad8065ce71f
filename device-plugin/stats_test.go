package deviceplugin

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
)

// fingerprinted returns a plugin whose inventory holds the fixture's GPUs.
func fingerprinted(t testing.TB, fx *fixture, cfg map[string]any) *Plugin {
	t.Helper()
	p, _ := newTestPlugin(t, fx.srv, cfg)
	p.refresh()
	return p
}

func statOf(t testing.TB, groups []*device.DeviceGroupStats, id string) *device.DeviceStats {
	t.Helper()
	for _, g := range groups {
		if st, ok := g.InstanceStats[id]; ok {
			return st
		}
	}
	t.Fatalf("no stats for %s", id)
	return nil
}

func TestStats_UnitsAndValues(t *testing.T) {
	fx := newFixture(t)
	p := fingerprinted(t, fx, nil)
	ts := time.Unix(1700000000, 0)
	groups := p.collectStats(ts)

	must.SliceLen(t, 1, groups)
	must.Eq(t, "nvidia", groups[0].Vendor)
	must.Eq(t, "gpu", groups[0].Type)
	must.Eq(t, fxModel, groups[0].Name)
	must.MapLen(t, 8, groups[0].InstanceStats)

	st := statOf(t, groups, fx.gpus[0].UUID)
	must.Eq(t, ts, st.Timestamp)
	a := st.Stats.Attributes

	floatStat := func(name string, want float64, unit string) {
		t.Helper()
		v := a[name]
		must.NotNil(t, v, must.Sprintf("stat %q missing", name))
		must.NotNil(t, v.FloatNumeratorVal, must.Sprintf("stat %q: %#v", name, v))
		must.Eq(t, want, *v.FloatNumeratorVal, must.Sprintf("stat %q", name))
		must.Eq(t, unit, v.Unit, must.Sprintf("stat %q unit", name))
	}
	intStat := func(name string, want int64, unit string) {
		t.Helper()
		v := a[name]
		must.NotNil(t, v, must.Sprintf("stat %q missing", name))
		must.NotNil(t, v.IntNumeratorVal, must.Sprintf("stat %q: %#v", name, v))
		must.Eq(t, want, *v.IntNumeratorVal, must.Sprintf("stat %q", name))
		must.Eq(t, unit, v.Unit, must.Sprintf("stat %q unit", name))
	}
	floatStat(StatPowerDraw, 250.5, "W")
	floatStat(StatPowerLimit, 400, "W")
	floatStat(StatEnergy, 123456.789, "J")
	intStat(StatGPUUtilization, 87, "%")
	intStat(StatMemoryUtilization, 42, "%")
	intStat(StatEncoderUtilization, 0, "%")
	intStat(StatDecoderUtilization, 5, "%")
	intStat(StatTemperature, fxTempC, "C")
	intStat(StatSMClock, fxSMClockMHz, "MHz")
	intStat(StatECCCorrected, fxECCCorrected, "#")
	intStat(StatECCUncorrected, 0, "#")
	intStat(StatMemoryState, 1024, "MiB")
	must.Eq(t, int64(40960), *a[StatMemoryState].IntDenominatorVal)
	intStat(StatBAR1State, 10, "MiB")
	must.Eq(t, int64(65536), *a[StatBAR1State].IntDenominatorVal)
	floatStat(StatPowerUsage, 250.5, "W")
	must.Eq(t, 400.0, *a[StatPowerUsage].FloatDenominatorVal)
	must.Eq(t, "sw_power_cap,hw_thermal_slowdown", *a[StatClockEventReasons].StringVal)

	// The summary Nomad shows is the power draw in watts.
	must.Eq(t, 250.5, *st.Summary.FloatNumeratorVal)
	must.Eq(t, "W", st.Summary.Unit)
}

func TestStats_PerTestOverrides(t *testing.T) {
	fx := newFixture(t)
	d := fx.gpus[4]
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
		return 0, nvml.ERROR_NOT_SUPPORTED // ECC off
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }
	d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, nvml.Return) {
		return nvml.ClocksThrottleReasonHwPowerBrakeSlowdown | nvml.ClocksEventReasonSwThermalSlowdown, nvml.SUCCESS
	}
	fx.state[4].PowerMW.Store(612_345)
	p := fingerprinted(t, fx, nil)

	a := statOf(t, p.collectStats(time.Now()), d.UUID).Stats.Attributes
	must.Eq(t, 612.345, *a[StatPowerDraw].FloatNumeratorVal)
	must.Eq(t, notAvailable, *a[StatEnergy].StringVal)
	must.Nil(t, a[StatEnergy].FloatNumeratorVal)
	must.Eq(t, "J", a[StatEnergy].Unit)
	must.Eq(t, notAvailable, *a[StatECCCorrected].StringVal)
	must.Eq(t, notAvailable, *a[StatECCUncorrected].StringVal)
	must.Eq(t, "sw_thermal_slowdown,hw_power_brake_slowdown", *a[StatClockEventReasons].StringVal,
		must.Sprint("falls back to the pre-535 throttle reasons call"))

	// The other GPUs are untouched.
	b := statOf(t, p.collectStats(time.Now()), fx.gpus[3].UUID).Stats.Attributes
	must.Eq(t, 123456.789, *b[StatEnergy].FloatNumeratorVal)
}

func TestClockEventReasonNames(t *testing.T) {
	cases := []struct {
		mask uint64
		want string
	}{
		{0, "none"},
		{nvml.ClocksEventReasonGpuIdle, "gpu_idle"},
		{nvml.ClocksEventReasonSwPowerCap, "sw_power_cap"},
		{nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksEventReasonSyncBoost, "hw_slowdown,sync_boost"},
		{nvml.ClocksEventReasonAll, "gpu_idle,applications_clocks_setting,sw_power_cap,hw_slowdown,sync_boost,sw_thermal_slowdown,hw_thermal_slowdown,hw_power_brake_slowdown,display_clock_setting"},
		{1 << 40, "other"},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, ClockEventReasonNames(tc.mask), must.Sprintf("mask %#x", tc.mask))
	}
}

func TestStats_StreamUsesStatsPeriod(t *testing.T) {
	fx := newFixture(t)
	p := fingerprinted(t, fx, map[string]any{"stats_period": "30ms"})
	ctx, cancel := context.WithCancel(context.Background())
	// Nomad asks for an hour; stats_period wins.
	ch, err := p.Stats(ctx, time.Hour)
	must.NoError(t, err)
	for i := 0; i < 3; i++ {
		select {
		case s := <-ch:
			must.NoError(t, s.Error)
			must.MapLen(t, 8, s.Groups[0].InstanceStats)
		case <-time.After(2 * time.Second):
			t.Fatal("stats_period not honoured")
		}
	}
	cancel()
	for range ch {
	}
}

// Ten thousand stats passes leave no goroutines behind and do not grow the
// heap (tolerance 1 MiB: GC timing noise, not a leak budget).
func TestStats_NoGrowthOver10000Passes(t *testing.T) {
	fx := newFixture(t)
	p := fingerprinted(t, fx, nil)
	for i := 0; i < 100; i++ { // warm up maps and pools
		p.collectStats(time.Now())
	}
	goroutines0, heap0 := settle()
	for i := 0; i < 10_000; i++ {
		p.collectStats(time.Now())
	}
	goroutines1, heap1 := settle()
	t.Logf("goroutines %d -> %d, live heap %d -> %d bytes", goroutines0, goroutines1, heap0, heap1)
	must.Eq(t, goroutines0, goroutines1)
	must.Less(t, int64(1<<20), int64(heap1)-int64(heap0))
}

func settle() (int, uint64) {
	var ms runtime.MemStats
	for i := 0; i < 3; i++ {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapAlloc
}

// BenchmarkStatsPass is one stats pass over the 8 GPUs of a mock DGX A100
// (goal ≤ 1 ms).
func BenchmarkStatsPass(b *testing.B) {
	fx := newFixture(b)
	p := fingerprinted(b, fx, nil)
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(p.collectStats(now)) != 1 {
			b.Fatal("no stats")
		}
	}
}

// BenchmarkFingerprintScan is one NVML scan plus health merge over 8 GPUs.
func BenchmarkFingerprintScan(b *testing.B) {
	fx := newFixture(b)
	p := fingerprinted(b, fx, nil)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if g, _ := p.refresh(); len(g) != 1 {
			b.Fatal("no devices")
		}
	}
}

// BenchmarkNVMLCallsOnly makes the same NVML calls as one stats pass and
// nothing else: the floor set by the mock, to read BenchmarkStatsPass against.
func BenchmarkNVMLCallsOnly(b *testing.B) {
	fx := newFixture(b)
	devs := fx.srv.Devices
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, d := range devs {
			d.GetMemoryInfo()
			d.GetPowerUsage()
			d.GetEnforcedPowerLimit()
			d.GetTotalEnergyConsumption()
			d.GetUtilizationRates()
			d.GetEncoderUtilization()
			d.GetDecoderUtilization()
			d.GetBAR1MemoryInfo()
			d.GetTemperature(nvml.TEMPERATURE_GPU)
			d.GetClockInfo(nvml.CLOCK_SM)
			d.GetCurrentClocksEventReasons()
			d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
			d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		}
	}
}
