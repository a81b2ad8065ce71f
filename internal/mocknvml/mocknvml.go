// Package mocknvml is an NVIDIA DGX A100 for the GPU device plugin to run
// against without GPUs: go-nvml's dgxa100 mock with every NVML call the
// plugin makes answered with fixed values (the constants below), per-GPU
// state a test can change, and an NVML event set fed from a channel. The
// plugin's unit tests and the e2e test's mock-GPU plugin binary use it.
package mocknvml

import (
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// Values every GPU of the machine reports, in NVML units.
const (
	PowerMW      = 250_500     // 250.5 W
	LimitMW      = 400_000     // 400 W
	EnergyMJ     = 123_456_789 // 123456.789 J
	MemUsed      = 1 << 30     // 1024 MiB
	BAR1Total    = 64 << 30    // 65536 MiB
	BAR1Used     = 10 << 20    // 10 MiB
	TempC        = 61          //
	SMClockMHz   = 1410        //
	MaxGfxMHz    = 1410        //
	MaxMemMHz    = 1215        //
	ECCCorrected = 3           //
	Reasons      = 4 | 64      // sw_power_cap, hw_thermal_slowdown
	Model        = "Mock NVIDIA A100-SXM4-40GB"
)

// GPUState holds what a GPU answers that a test changes while the plugin
// runs; atomics keep the race detector quiet.
type GPUState struct {
	Lost    atomic.Bool   // every query but GetUUID returns ERROR_GPU_IS_LOST
	PowerMW atomic.Uint32 // GetPowerUsage
	Reasons atomic.Uint64 // GetCurrentClocksEventReasons
}

func (s *GPUState) ret() nvml.Return {
	if s.Lost.Load() {
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}

// quietDevice forwards the argument-taking calls the plugin makes straight
// to the mock's funcs: moq records every call's arguments, which would grow
// without bound in a long run (the 10,000-pass growth check, a plugin
// process serving a Nomad agent).
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

// Machine is a DGX A100 from go-nvml's mock with every NVML call the plugin
// makes answered, plus an event channel behind its event set.
type Machine struct {
	// Server is the nvml.Interface to hand the plugin.
	Server *dgxa100.Server
	GPUs   []*dgxa100.Device
	State  []*GPUState
	// Events are what the event set's Wait returns.
	Events chan nvml.EventData
	// WaitErrs makes the event set's Wait fail with these codes.
	WaitErrs chan nvml.Return
	// LostHandle makes DeviceGetHandleByIndex fail with ERROR_GPU_IS_LOST
	// for this index (-1: none).
	LostHandle atomic.Int32
}

// New returns the machine: eight healthy A100s, MIG off.
func New() *Machine {
	m := &Machine{Server: dgxa100.New(), Events: make(chan nvml.EventData, 16), WaitErrs: make(chan nvml.Return, 4)}
	m.LostHandle.Store(-1)
	for i := range m.Server.Devices {
		d := m.Server.Devices[i].(*dgxa100.Device)
		st := &GPUState{}
		st.PowerMW.Store(PowerMW)
		st.Reasons.Store(Reasons)
		m.GPUs = append(m.GPUs, d)
		m.State = append(m.State, st)
		m.Server.Devices[i] = quietDevice{d}
		answer(d, st)
	}
	byIndex := m.Server.DeviceGetHandleByIndexFunc
	m.Server.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if int32(i) == m.LostHandle.Load() {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return byIndex(i)
	}
	m.Server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				timer := time.NewTimer(time.Duration(ms) * time.Millisecond)
				defer timer.Stop()
				select {
				case e := <-m.Events:
					return e, nvml.SUCCESS
				case ret := <-m.WaitErrs:
					return nvml.EventData{}, ret
				case <-timer.C:
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return m
}

// answer sets every query the plugin makes on d to answer from st.
func answer(d *dgxa100.Device, st *GPUState) {
	d.MemoryInfo.Used = MemUsed
	d.MemoryInfo.Free = d.MemoryInfo.Total - MemUsed
	d.GetNameFunc = func() (string, nvml.Return) { return d.Name, st.ret() }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return d.MemoryInfo, st.ret() }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		var p nvml.PciInfo
		copy(p.BusId[:], d.PciBusID)
		return p, st.ret()
	}
	d.GetBAR1MemoryInfoFunc = func() (nvml.BAR1Memory, nvml.Return) {
		return nvml.BAR1Memory{Bar1Total: BAR1Total, Bar1Used: BAR1Used, Bar1Free: BAR1Total - BAR1Used}, st.ret()
	}
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return LimitMW, st.ret() }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return st.PowerMW.Load(), st.ret() }
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return EnergyMJ, st.ret() }
	d.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
		if c == nvml.CLOCK_MEM {
			return MaxMemMHz, st.ret()
		}
		return MaxGfxMHz, st.ret()
	}
	d.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return SMClockMHz, st.ret() }
	d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return 4, st.ret() }
	d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return 16, st.ret() }
	d.GetDisplayModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, st.ret() }
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, st.ret() }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{Gpu: 87, Memory: 42}, st.ret()
	}
	d.GetEncoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return 0, 1000, st.ret() }
	d.GetDecoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return 5, 1000, st.ret() }
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return TempC, st.ret() }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return st.Reasons.Load(), st.ret() }
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, _ nvml.EccCounterType) (uint64, nvml.Return) {
		if t == nvml.MEMORY_ERROR_TYPE_CORRECTED {
			return ECCCorrected, st.ret()
		}
		return 0, st.ret()
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, st.ret()
	}
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return st.ret() }
	migMode := d.GetMigModeFunc
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		if st.Lost.Load() {
			return 0, 0, nvml.ERROR_GPU_IS_LOST
		}
		return migMode()
	}
}
