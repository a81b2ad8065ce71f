package deviceplugin

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// Stat names under DeviceStats.Stats.Attributes. "Power usage", "GPU
// utilization", "Memory utilization", "Encoder utilization", "Decoder
// utilization", "Temperature", "Memory state" and "BAR1 buffer state" are
// nomad-device-nvidia's names (here with correct units); the rest are new.
const (
	StatPowerDraw          = "Power draw"          // W, float; also the summary
	StatPowerLimit         = "Power limit"         // enforced limit, W, float
	StatPowerUsage         = "Power usage"         // draw / enforced limit, W
	StatEnergy             = "Energy"              // J since driver load, float
	StatGPUUtilization     = "GPU utilization"     // %
	StatMemoryUtilization  = "Memory utilization"  // %
	StatEncoderUtilization = "Encoder utilization" // %
	StatDecoderUtilization = "Decoder utilization" // %
	StatMemoryState        = "Memory state"        // used / total MiB
	StatBAR1State          = "BAR1 buffer state"   // used / total MiB
	StatTemperature        = "Temperature"         // C
	StatSMClock            = "SM clock"            // MHz
	StatClockEventReasons  = "Clock event reasons" // comma-separated names, "none"
	StatECCCorrected       = "ECC errors corrected"
	StatECCUncorrected     = "ECC errors uncorrected"
)

const notAvailable = "N/A"

// clockEventReasons maps NVML clock-event (throttle) reason bits to names.
var clockEventReasons = []struct {
	bit  uint64
	name string
}{
	{nvml.ClocksEventReasonGpuIdle, "gpu_idle"},
	{nvml.ClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting"},
	{nvml.ClocksEventReasonSwPowerCap, "sw_power_cap"},
	{nvml.ClocksThrottleReasonHwSlowdown, "hw_slowdown"},
	{nvml.ClocksEventReasonSyncBoost, "sync_boost"},
	{nvml.ClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"},
	{nvml.ClocksThrottleReasonHwThermalSlowdown, "hw_thermal_slowdown"},
	{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
	{nvml.ClocksEventReasonDisplayClockSetting, "display_clock_setting"},
}

// ClockEventReasonNames renders a clock-event reason mask as names.
func ClockEventReasonNames(mask uint64) string {
	if mask == 0 {
		return "none"
	}
	var names []string
	for _, r := range clockEventReasons {
		if mask&r.bit != 0 {
			names = append(names, r.name)
			mask &^= r.bit
		}
	}
	if mask != 0 {
		names = append(names, "other")
	}
	return strings.Join(names, ",")
}

// Stats streams statistics of the fingerprinted devices every interval (or
// every stats_period when configured).
func (p *Plugin) Stats(ctx context.Context, interval time.Duration) (<-chan *device.StatsResponse, error) {
	cfg := p.config()
	if !cfg.Enabled {
		return nil, device.ErrPluginDisabled
	}
	if cfg.StatsPeriod > 0 {
		interval = cfg.StatsPeriod
	}
	if interval <= 0 {
		interval = time.Second
	}
	out := make(chan *device.StatsResponse)
	go func() {
		defer close(out)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			resp := &device.StatsResponse{Groups: p.collectStats(time.Now())}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			}
			timer.Reset(interval)
		}
	}()
	return out, nil
}

// collectStats reads one sample of every known, reachable device. Lost
// devices are left out (and marked lost if this pass found out).
func (p *Plugin) collectStats(ts time.Time) []*device.DeviceGroupStats {
	p.mu.Lock()
	gpus := make([]*gpu, 0, len(p.devices))
	for id, g := range p.devices {
		if p.health[id].lost == "" {
			gpus = append(gpus, g)
		}
	}
	p.mu.Unlock()
	sort.Slice(gpus, func(a, b int) bool { return gpus[a].ID < gpus[b].ID })

	var groups []*device.DeviceGroupStats
	byName := map[string]*device.DeviceGroupStats{}
	for _, g := range gpus {
		var pr probe
		st := readStats(g, &pr, ts)
		if pr.lost {
			p.markLost(g.ID)
			continue
		}
		grp := byName[g.Name]
		if grp == nil {
			grp = &device.DeviceGroupStats{
				Vendor:        vendor,
				Type:          deviceType,
				Name:          g.Name,
				InstanceStats: map[string]*device.DeviceStats{},
			}
			byName[g.Name] = grp
			groups = append(groups, grp)
		}
		grp.InstanceStats[g.ID] = st
	}
	sort.Slice(groups, func(a, b int) bool { return groups[a].Name < groups[b].Name })
	return groups
}

// readStats reads one device's sample. NVML's milliwatts and millijoules
// become watts and joules here.
func readStats(g *gpu, pr *probe, ts time.Time) *device.DeviceStats {
	dev := g.handle
	attrs := make(map[string]*structs.StatValue, 15)

	if mem, ret := dev.GetMemoryInfo(); pr.ok(ret) {
		attrs[StatMemoryState] = ratio(int64(mem.Used>>20), int64(mem.Total>>20), unitMiB, "Used / total device memory")
	} else {
		attrs[StatMemoryState] = na(unitMiB, "Used / total device memory")
	}
	if g.MIG {
		// MIG instances have no power, clock or utilization telemetry of their
		// own (NVIDIA MIG user guide, "Telemetry"); their GPU's numbers are
		// shared by all instances and would mislead a per-instance reader.
		return &device.DeviceStats{
			Summary:   attrs[StatMemoryState],
			Stats:     &structs.StatObject{Attributes: attrs},
			Timestamp: ts,
		}
	}

	draw, limit := na(unitW, "Power draw of the GPU and its memory"), na(unitW, "Enforced power limit")
	mwDraw, retDraw := dev.GetPowerUsage()
	if pr.ok(retDraw) {
		draw = float(float64(mwDraw)/1000, unitW, "Power draw of the GPU and its memory")
	}
	mwLimit, retLimit := dev.GetEnforcedPowerLimit()
	if pr.ok(retLimit) {
		limit = float(float64(mwLimit)/1000, unitW, "Enforced power limit")
	}
	attrs[StatPowerDraw] = draw
	attrs[StatPowerLimit] = limit
	if retDraw == nvml.SUCCESS && retLimit == nvml.SUCCESS {
		w, l := float64(mwDraw)/1000, float64(mwLimit)/1000
		attrs[StatPowerUsage] = &structs.StatValue{FloatNumeratorVal: &w, FloatDenominatorVal: &l, Unit: unitW, Desc: "Power draw / enforced power limit"}
	} else {
		attrs[StatPowerUsage] = na(unitW, "Power draw / enforced power limit")
	}

	if mj, ret := dev.GetTotalEnergyConsumption(); pr.ok(ret) {
		attrs[StatEnergy] = float(float64(mj)/1000, "J", "Energy consumed since the driver was loaded")
	} else {
		attrs[StatEnergy] = na("J", "Energy consumed since the driver was loaded")
	}

	if u, ret := dev.GetUtilizationRates(); pr.ok(ret) {
		attrs[StatGPUUtilization] = integer(int64(u.Gpu), "%", "Time a kernel was running over the last sample period")
		attrs[StatMemoryUtilization] = integer(int64(u.Memory), "%", "Time device memory was read or written over the last sample period")
	} else {
		attrs[StatGPUUtilization] = na("%", "Time a kernel was running over the last sample period")
		attrs[StatMemoryUtilization] = na("%", "Time device memory was read or written over the last sample period")
	}
	if u, _, ret := dev.GetEncoderUtilization(); pr.ok(ret) {
		attrs[StatEncoderUtilization] = integer(int64(u), "%", "Video encoder utilization")
	} else {
		attrs[StatEncoderUtilization] = na("%", "Video encoder utilization")
	}
	if u, _, ret := dev.GetDecoderUtilization(); pr.ok(ret) {
		attrs[StatDecoderUtilization] = integer(int64(u), "%", "Video decoder utilization")
	} else {
		attrs[StatDecoderUtilization] = na("%", "Video decoder utilization")
	}
	if b, ret := dev.GetBAR1MemoryInfo(); pr.ok(ret) {
		attrs[StatBAR1State] = ratio(int64(b.Bar1Used>>20), int64(b.Bar1Total>>20), unitMiB, "Used / total BAR1 memory")
	} else {
		attrs[StatBAR1State] = na(unitMiB, "Used / total BAR1 memory")
	}
	if t, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); pr.ok(ret) {
		attrs[StatTemperature] = integer(int64(t), "C", "GPU die temperature")
	} else {
		attrs[StatTemperature] = na("C", "GPU die temperature")
	}
	if mhz, ret := dev.GetClockInfo(nvml.CLOCK_SM); pr.ok(ret) {
		attrs[StatSMClock] = integer(int64(mhz), unitMHz, "Current SM clock")
	} else {
		attrs[StatSMClock] = na(unitMHz, "Current SM clock")
	}

	mask, ret := dev.GetCurrentClocksEventReasons()
	if ret == nvml.ERROR_FUNCTION_NOT_FOUND || ret == nvml.ERROR_NOT_SUPPORTED {
		// Drivers before 535 only export the older "throttle reasons" call.
		mask, ret = dev.GetCurrentClocksThrottleReasons()
	}
	if pr.ok(ret) {
		s := ClockEventReasonNames(mask)
		attrs[StatClockEventReasons] = &structs.StatValue{StringVal: &s, Desc: "Why clocks are held below maximum (power cap, thermal, ...)"}
	} else {
		attrs[StatClockEventReasons] = na("", "Why clocks are held below maximum (power cap, thermal, ...)")
	}

	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); pr.ok(ret) {
		attrs[StatECCCorrected] = integer(int64(n), "#", "Corrected ECC errors since the driver was loaded")
	} else {
		attrs[StatECCCorrected] = na("#", "Corrected ECC errors since the driver was loaded (N/A: ECC off or unsupported)")
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); pr.ok(ret) {
		attrs[StatECCUncorrected] = integer(int64(n), "#", "Uncorrected ECC errors since the driver was loaded")
	} else {
		attrs[StatECCUncorrected] = na("#", "Uncorrected ECC errors since the driver was loaded (N/A: ECC off or unsupported)")
	}

	return &device.DeviceStats{
		Summary:   draw,
		Stats:     &structs.StatObject{Attributes: attrs},
		Timestamp: ts,
	}
}

func float(v float64, unit, desc string) *structs.StatValue {
	return &structs.StatValue{FloatNumeratorVal: &v, Unit: unit, Desc: desc}
}

func integer(v int64, unit, desc string) *structs.StatValue {
	return &structs.StatValue{IntNumeratorVal: &v, Unit: unit, Desc: desc}
}

func ratio(num, den int64, unit, desc string) *structs.StatValue {
	return &structs.StatValue{IntNumeratorVal: &num, IntDenominatorVal: &den, Unit: unit, Desc: desc}
}

func na(unit, desc string) *structs.StatValue {
	s := notAvailable
	return &structs.StatValue{StringVal: &s, Unit: unit, Desc: desc}
}
