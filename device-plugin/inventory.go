package deviceplugin

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// Fingerprint attribute names. The first nine are nomad-device-nvidia's, so
// job constraints written for it keep working.
const (
	AttrMemory            = "memory"
	AttrBAR1              = "bar1"
	AttrDriverVersion     = "driver_version"
	AttrCoresClock        = "cores_clock"
	AttrMemoryClock       = "memory_clock"
	AttrPCIBandwidth      = "pci_bandwidth"
	AttrDisplayState      = "display_state"
	AttrPersistenceMode   = "persistence_mode"
	AttrPower             = "power" // enforced power limit, W
	AttrComputeCapability = "compute_capability"
	AttrCUDADriverVersion = "cuda_driver_version"
)

// Units of the attributes and stats, as Nomad's client spells them (it
// refuses a device attribute with a unit it does not know).
const (
	unitMiB    = "MiB"
	unitW      = "W"
	unitMHz    = "MHz"
	unitMBPerS = "MB/s"
)

// lostReason is the health description of a GPU that NVML reports as lost.
const lostReason = "GPU has fallen off the bus (NVML: ERROR_GPU_IS_LOST)"

// gpu is one schedulable device: a whole GPU, or a MIG instance when MIG
// mode is on.
type gpu struct {
	ID       string // GPU-... or MIG-... UUID
	Name     string // model name; one device group per name
	PCIBusID string
	Physical string // UUID of the physical GPU (== ID for a whole GPU)
	MIG      bool
	GIID     int         // GPU instance id of a MIG instance
	handle   nvml.Device // MIG handle or whole-GPU handle
	Attrs    map[string]*structs.Attribute
	lost     bool // an NVML query returned ERROR_GPU_IS_LOST during the scan
}

// physicalGPU is a physical GPU handle, for event registration.
type physicalGPU struct {
	UUID   string
	handle nvml.Device
}

// scan is one enumeration of NVML's devices.
type scan struct {
	gpus     []*gpu // sorted by ID
	physical []physicalGPU
	// lostUnknown counts indexes whose handle or UUID could not be read
	// because the GPU is lost: their identity is unknown, so previously known
	// devices missing from the scan are kept as lost rather than dropped.
	lostUnknown int
}

// probe turns NVML return codes into "value present" and remembers whether
// the GPU was lost. Unsupported queries simply leave the value out.
type probe struct{ lost bool }

func (p *probe) ok(ret nvml.Return) bool {
	switch ret {
	case nvml.SUCCESS:
		return true
	case nvml.ERROR_GPU_IS_LOST:
		p.lost = true
	}
	return false
}

// enumerate lists the devices NVML sees. ignored UUIDs (whole GPUs or MIG
// instances) are left out. An error means NVML could not be asked at all.
func enumerate(lib nvml.Interface, ignored map[string]struct{}) (*scan, error) {
	driverVersion, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		driverVersion = ""
	}
	cudaVersion := ""
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		cudaVersion = fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
	}

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %w", ret)
	}

	s := &scan{}
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_GPU_IS_LOST {
			s.lostUnknown++
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting handle of GPU %d: %w", i, ret)
		}
		uuid, ret := dev.GetUUID()
		if ret == nvml.ERROR_GPU_IS_LOST {
			s.lostUnknown++
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting UUID of GPU %d: %w", i, ret)
		}
		s.physical = append(s.physical, physicalGPU{UUID: uuid, handle: dev})

		var p probe
		whole := readGPU(dev, uuid, &p)
		if driverVersion != "" {
			whole.Attrs[AttrDriverVersion] = structs.NewStringAttribute(driverVersion)
		}
		if cudaVersion != "" {
			whole.Attrs[AttrCUDADriverVersion] = structs.NewStringAttribute(cudaVersion)
		}

		migs := readMIGs(dev, whole, &p)
		whole.lost = p.lost
		if migs == nil {
			if _, skip := ignored[uuid]; !skip {
				s.gpus = append(s.gpus, whole)
			}
			continue
		}
		for _, m := range migs {
			m.lost = p.lost
			if _, skip := ignored[m.ID]; !skip {
				s.gpus = append(s.gpus, m)
			}
		}
	}
	sort.Slice(s.gpus, func(a, b int) bool { return s.gpus[a].ID < s.gpus[b].ID })
	return s, nil
}

// readGPU reads the fingerprint attributes of a whole GPU.
func readGPU(dev nvml.Device, uuid string, p *probe) *gpu {
	g := &gpu{
		ID:       uuid,
		Physical: uuid,
		handle:   dev,
		Attrs:    make(map[string]*structs.Attribute, 11),
		Name:     "N/A",
	}
	if name, ret := dev.GetName(); p.ok(ret) {
		g.Name = name
	}
	if pci, ret := dev.GetPciInfo(); p.ok(ret) {
		g.PCIBusID = cString(pci.BusId[:])
	}
	if mem, ret := dev.GetMemoryInfo(); p.ok(ret) {
		g.Attrs[AttrMemory] = structs.NewIntAttribute(int64(mem.Total>>20), unitMiB)
	}
	if bar1, ret := dev.GetBAR1MemoryInfo(); p.ok(ret) {
		g.Attrs[AttrBAR1] = structs.NewIntAttribute(int64(bar1.Bar1Total>>20), unitMiB)
	}
	if mw, ret := dev.GetEnforcedPowerLimit(); p.ok(ret) {
		g.Attrs[AttrPower] = structs.NewIntAttribute(int64((mw+500)/1000), unitW)
	}
	// Maximum clocks, not current ones: an attribute must not move with load,
	// or every fingerprint would differ.
	if mhz, ret := dev.GetMaxClockInfo(nvml.CLOCK_GRAPHICS); p.ok(ret) {
		g.Attrs[AttrCoresClock] = structs.NewIntAttribute(int64(mhz), unitMHz)
	}
	if mhz, ret := dev.GetMaxClockInfo(nvml.CLOCK_MEM); p.ok(ret) {
		g.Attrs[AttrMemoryClock] = structs.NewIntAttribute(int64(mhz), unitMHz)
	}
	gen, retGen := dev.GetMaxPcieLinkGeneration()
	width, retWidth := dev.GetMaxPcieLinkWidth()
	if p.ok(retGen) && p.ok(retWidth) {
		g.Attrs[AttrPCIBandwidth] = structs.NewIntAttribute(pciBandwidthMBps(gen, width), unitMBPerS)
	}
	if mode, ret := dev.GetDisplayMode(); p.ok(ret) {
		g.Attrs[AttrDisplayState] = structs.NewStringAttribute(enableState(mode))
	}
	if mode, ret := dev.GetPersistenceMode(); p.ok(ret) {
		g.Attrs[AttrPersistenceMode] = structs.NewStringAttribute(enableState(mode))
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); p.ok(ret) {
		g.Attrs[AttrComputeCapability] = structs.NewStringAttribute(fmt.Sprintf("%d.%d", major, minor))
	}
	return g
}

// readMIGs returns the MIG instances of a GPU in MIG mode, or nil when MIG is
// off or unsupported. Instances inherit the parent's attributes except name
// and memory.
func readMIGs(dev nvml.Device, parent *gpu, p *probe) []*gpu {
	current, _, ret := dev.GetMigMode()
	if !p.ok(ret) || current != nvml.DEVICE_MIG_ENABLE {
		return nil
	}
	slots, ret := dev.GetMaxMigDeviceCount()
	if !p.ok(ret) {
		return nil
	}
	migs := []*gpu{}
	for j := 0; j < slots; j++ {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if !p.ok(ret) {
			continue // ERROR_NOT_FOUND: slot not populated
		}
		uuid, ret := mig.GetUUID()
		if !p.ok(ret) {
			continue
		}
		m := &gpu{
			ID:       uuid,
			Name:     parent.Name + " MIG",
			PCIBusID: parent.PCIBusID,
			Physical: parent.ID,
			MIG:      true,
			GIID:     -1,
			handle:   mig,
			Attrs:    make(map[string]*structs.Attribute, len(parent.Attrs)),
		}
		for k, v := range parent.Attrs {
			m.Attrs[k] = v
		}
		if name, ret := mig.GetName(); p.ok(ret) {
			m.Name = name
		}
		if mem, ret := mig.GetMemoryInfo(); p.ok(ret) {
			m.Attrs[AttrMemory] = structs.NewIntAttribute(int64(mem.Total>>20), unitMiB)
		}
		if id, ret := mig.GetGpuInstanceId(); p.ok(ret) {
			m.GIID = id
		}
		migs = append(migs, m)
	}
	return migs
}

// pciBandwidthMBps is the maximum one-direction PCIe bandwidth in MB/s.
// Gen 3 and 4 use the same numbers as nomad-device-nvidia (1024 and 2048
// MB/s per lane) so existing constraints keep matching; gen 5 and 6 double
// again (nomad-device-nvidia reports 3072 and 4096, which undercounts).
func pciBandwidthMBps(gen, width int) int64 {
	if gen < 1 || gen > 6 || width < 1 {
		return 0
	}
	perLane := int64(256) << (gen - 1)
	return perLane * int64(width)
}

func enableState(s nvml.EnableState) string {
	if s == nvml.FEATURE_ENABLED {
		return "Enabled"
	}
	return "Disabled"
}

// cString converts a NUL-terminated C char array.
func cString[T ~int8 | ~uint8](b []T) string {
	buf := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		buf = append(buf, byte(c))
	}
	return string(bytes.TrimSpace(buf))
}
