package drivers

import (
	"maps"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// TaskConfigFromProto converts a task config from the wire; nil gives an
// empty config.
func TaskConfigFromProto(pb *driverspb.TaskConfig) *TaskConfig {
	if pb == nil {
		return &TaskConfig{}
	}
	tc := &TaskConfig{
		ID:               pb.GetId(),
		JobName:          pb.GetJobName(),
		JobID:            pb.GetJobId(),
		TaskGroupName:    pb.GetTaskGroupName(),
		ParentJobID:      pb.GetParentJobId(),
		Name:             pb.GetName(),
		Namespace:        pb.GetNamespace(),
		NodeName:         pb.GetNodeName(),
		NodeID:           pb.GetNodeId(),
		Env:              pb.GetEnv(),
		DeviceEnv:        pb.GetDeviceEnv(),
		Resources:        resourcesFromProto(pb.GetResources()),
		User:             pb.GetUser(),
		AllocDir:         pb.GetAllocDir(),
		StdoutPath:       pb.GetStdoutPath(),
		StderrPath:       pb.GetStderrPath(),
		AllocID:          pb.GetAllocId(),
		NetworkIsolation: NetworkIsolationSpecFromProto(pb.GetNetworkIsolationSpec()),
		rawDriverConfig:  pb.GetMsgpackDriverConfig(),
	}
	for _, d := range pb.GetDevices() {
		tc.Devices = append(tc.Devices, &DeviceConfig{TaskPath: d.GetTaskPath(), HostPath: d.GetHostPath(), Permissions: d.GetCgroupPermissions()})
	}
	for _, m := range pb.GetMounts() {
		tc.Mounts = append(tc.Mounts, &MountConfig{TaskPath: m.GetTaskPath(), HostPath: m.GetHostPath(), Readonly: m.GetReadonly(),
			PropagationMode: m.GetPropagationMode(), SELinuxLabel: m.GetSelinuxLabel()})
	}
	if dns := pb.GetDns(); dns != nil {
		tc.DNS = &DNSConfig{Servers: dns.GetServers(), Searches: dns.GetSearches(), Options: dns.GetOptions()}
	}
	return tc
}

// TaskConfigToProto converts a task config for the wire.
func TaskConfigToProto(tc *TaskConfig) *driverspb.TaskConfig {
	if tc == nil {
		return &driverspb.TaskConfig{}
	}
	pb := &driverspb.TaskConfig{
		Id:                   tc.ID,
		JobName:              tc.JobName,
		JobId:                tc.JobID,
		TaskGroupName:        tc.TaskGroupName,
		ParentJobId:          tc.ParentJobID,
		Name:                 tc.Name,
		Namespace:            tc.Namespace,
		NodeName:             tc.NodeName,
		NodeId:               tc.NodeID,
		Env:                  tc.Env,
		DeviceEnv:            tc.DeviceEnv,
		Resources:            resourcesToProto(tc.Resources),
		User:                 tc.User,
		AllocDir:             tc.AllocDir,
		StdoutPath:           tc.StdoutPath,
		StderrPath:           tc.StderrPath,
		AllocId:              tc.AllocID,
		NetworkIsolationSpec: NetworkIsolationSpecToProto(tc.NetworkIsolation),
		MsgpackDriverConfig:  tc.rawDriverConfig,
	}
	for _, d := range tc.Devices {
		pb.Devices = append(pb.Devices, &driverspb.Device{TaskPath: d.TaskPath, HostPath: d.HostPath, CgroupPermissions: d.Permissions})
	}
	for _, m := range tc.Mounts {
		pb.Mounts = append(pb.Mounts, &driverspb.Mount{TaskPath: m.TaskPath, HostPath: m.HostPath, Readonly: m.Readonly,
			PropagationMode: m.PropagationMode, SelinuxLabel: m.SELinuxLabel})
	}
	if tc.DNS != nil {
		pb.Dns = &driverspb.DNSConfig{Servers: tc.DNS.Servers, Searches: tc.DNS.Searches, Options: tc.DNS.Options}
	}
	return pb
}

func resourcesFromProto(pb *driverspb.Resources) *Resources {
	r := &Resources{}
	if pb == nil {
		return r
	}
	if ar := pb.GetAllocatedResources(); ar != nil {
		r.NomadResources = &AllocatedTaskResources{
			CPUShares:   ar.GetCpu().GetCpuShares(),
			MemoryMB:    ar.GetMemory().GetMemoryMb(),
			MemoryMaxMB: ar.GetMemory().GetMemoryMaxMb(),
		}
	}
	if lr := pb.GetLinuxResources(); lr != nil {
		r.LinuxResources = &LinuxResources{
			CPUPeriod:        lr.GetCpuPeriod(),
			CPUQuota:         lr.GetCpuQuota(),
			CPUShares:        lr.GetCpuShares(),
			MemoryLimitBytes: lr.GetMemoryLimitBytes(),
			OOMScoreAdj:      lr.GetOomScoreAdj(),
			CpusetCpus:       lr.GetCpusetCpus(),
			CpusetCgroupPath: lr.GetCpusetCgroup(),
			PercentTicks:     lr.GetPercentTicks(),
		}
	}
	for _, p := range pb.GetPorts() {
		r.Ports = append(r.Ports, PortMapping{Label: p.GetLabel(), Value: int(p.GetValue()), To: int(p.GetTo()), HostIP: p.GetHostIp()})
	}
	return r
}

func resourcesToProto(r *Resources) *driverspb.Resources {
	if r == nil {
		return nil
	}
	pb := &driverspb.Resources{}
	if nr := r.NomadResources; nr != nil {
		pb.AllocatedResources = &driverspb.AllocatedTaskResources{
			Cpu:    &driverspb.AllocatedCpuResources{CpuShares: nr.CPUShares},
			Memory: &driverspb.AllocatedMemoryResources{MemoryMb: nr.MemoryMB, MemoryMaxMb: nr.MemoryMaxMB},
		}
	}
	if lr := r.LinuxResources; lr != nil {
		pb.LinuxResources = &driverspb.LinuxResources{
			CpuPeriod:        lr.CPUPeriod,
			CpuQuota:         lr.CPUQuota,
			CpuShares:        lr.CPUShares,
			MemoryLimitBytes: lr.MemoryLimitBytes,
			OomScoreAdj:      lr.OOMScoreAdj,
			CpusetCpus:       lr.CpusetCpus,
			CpusetCgroup:     lr.CpusetCgroupPath,
			PercentTicks:     lr.PercentTicks,
		}
	}
	for _, p := range r.Ports {
		pb.Ports = append(pb.Ports, &driverspb.PortMapping{Label: p.Label, Value: clampInt32(p.Value), To: clampInt32(p.To), HostIp: p.HostIP})
	}
	return pb
}

func clampInt32(v int) int32 {
	return int32(max(min(v, math.MaxInt32), math.MinInt32))
}

var netModeToProto = map[NetIsolationMode]driverspb.NetworkIsolationSpec_NetworkIsolationMode{
	NetIsolationModeHost:  driverspb.NetworkIsolationSpec_HOST,
	NetIsolationModeGroup: driverspb.NetworkIsolationSpec_GROUP,
	NetIsolationModeTask:  driverspb.NetworkIsolationSpec_TASK,
	NetIsolationModeNone:  driverspb.NetworkIsolationSpec_NONE,
}

func netIsolationModeToProto(m NetIsolationMode) driverspb.NetworkIsolationSpec_NetworkIsolationMode {
	return netModeToProto[m] // unknown: HOST (0)
}

func netIsolationModeFromProto(pb driverspb.NetworkIsolationSpec_NetworkIsolationMode) NetIsolationMode {
	for m, p := range netModeToProto {
		if p == pb {
			return m
		}
	}
	return NetIsolationModeHost
}

// NetworkIsolationSpecFromProto converts a network namespace spec; nil stays nil.
func NetworkIsolationSpecFromProto(pb *driverspb.NetworkIsolationSpec) *NetworkIsolationSpec {
	if pb == nil {
		return nil
	}
	s := &NetworkIsolationSpec{Mode: netIsolationModeFromProto(pb.GetMode()), Path: pb.GetPath(), Labels: pb.GetLabels()}
	if hc := pb.GetHostsConfig(); hc != nil {
		s.HostsConfig = &HostsConfig{Hostname: hc.GetHostname(), Address: hc.GetAddress()}
	}
	return s
}

// NetworkIsolationSpecToProto converts a network namespace spec; nil stays nil.
func NetworkIsolationSpecToProto(s *NetworkIsolationSpec) *driverspb.NetworkIsolationSpec {
	if s == nil {
		return nil
	}
	pb := &driverspb.NetworkIsolationSpec{Mode: netIsolationModeToProto(s.Mode), Path: s.Path, Labels: s.Labels}
	if s.HostsConfig != nil {
		pb.HostsConfig = &driverspb.HostsConfig{Hostname: s.HostsConfig.Hostname, Address: s.HostsConfig.Address}
	}
	return pb
}

var taskStateToProto = map[TaskState]driverspb.TaskState{
	TaskStateUnknown: driverspb.TaskState_UNKNOWN,
	TaskStateRunning: driverspb.TaskState_RUNNING,
	TaskStateExited:  driverspb.TaskState_EXITED,
}

func taskStateFromProto(pb driverspb.TaskState) TaskState {
	switch pb {
	case driverspb.TaskState_RUNNING:
		return TaskStateRunning
	case driverspb.TaskState_EXITED:
		return TaskStateExited
	default:
		return TaskStateUnknown
	}
}

// TaskHandleFromProto converts a task handle; nil gives an empty handle.
func TaskHandleFromProto(pb *driverspb.TaskHandle) *TaskHandle {
	if pb == nil {
		return &TaskHandle{Config: &TaskConfig{}}
	}
	return &TaskHandle{
		Version:     int(pb.GetVersion()),
		Config:      TaskConfigFromProto(pb.GetConfig()),
		State:       taskStateFromProto(pb.GetState()),
		DriverState: pb.GetDriverState(),
	}
}

// TaskHandleToProto converts a task handle; nil stays nil.
func TaskHandleToProto(h *TaskHandle) *driverspb.TaskHandle {
	if h == nil {
		return nil
	}
	return &driverspb.TaskHandle{
		Version:     clampInt32(h.Version),
		Config:      TaskConfigToProto(h.Config),
		State:       taskStateToProto[h.State],
		DriverState: h.DriverState,
	}
}

// ExitResultToProto converts an exit result; nil gives a zero result.
func ExitResultToProto(r *ExitResult) *driverspb.ExitResult {
	if r == nil {
		return &driverspb.ExitResult{}
	}
	return &driverspb.ExitResult{ExitCode: clampInt32(r.ExitCode), Signal: clampInt32(r.Signal), OomKilled: r.OOMKilled}
}

// ExitResultFromProto converts an exit result; nil gives a zero result.
func ExitResultFromProto(pb *driverspb.ExitResult) *ExitResult {
	return &ExitResult{ExitCode: int(pb.GetExitCode()), Signal: int(pb.GetSignal()), OOMKilled: pb.GetOomKilled()}
}

// TaskStatusToProto converts a task status (without its attributes and
// network, which travel beside it in InspectTaskResponse).
func TaskStatusToProto(s *TaskStatus) *driverspb.TaskStatus {
	return &driverspb.TaskStatus{
		Id:          s.ID,
		Name:        s.Name,
		State:       taskStateToProto[s.State],
		StartedAt:   timestamppb.New(s.StartedAt),
		CompletedAt: timestamppb.New(s.CompletedAt),
		Result:      ExitResultToProto(s.ExitResult),
	}
}

// TaskStatusFromProto converts a task status.
func TaskStatusFromProto(pb *driverspb.TaskStatus) *TaskStatus {
	return &TaskStatus{
		ID:          pb.GetId(),
		Name:        pb.GetName(),
		State:       taskStateFromProto(pb.GetState()),
		StartedAt:   pb.GetStartedAt().AsTime(),
		CompletedAt: pb.GetCompletedAt().AsTime(),
		ExitResult:  ExitResultFromProto(pb.GetResult()),
	}
}

// DriverNetworkToProto converts a network override; nil stays nil.
func DriverNetworkToProto(n *DriverNetwork) *driverspb.NetworkOverride {
	if n == nil {
		return nil
	}
	pb := &driverspb.NetworkOverride{PortMap: make(map[string]int32, len(n.PortMap)), Addr: n.IP, AutoAdvertise: n.AutoAdvertise}
	for k, v := range n.PortMap {
		pb.PortMap[k] = clampInt32(v)
	}
	return pb
}

// DriverNetworkFromProto converts a network override; nil stays nil.
func DriverNetworkFromProto(pb *driverspb.NetworkOverride) *DriverNetwork {
	if pb == nil {
		return nil
	}
	n := &DriverNetwork{PortMap: make(map[string]int, len(pb.GetPortMap())), IP: pb.GetAddr(), AutoAdvertise: pb.GetAutoAdvertise()}
	for k, v := range pb.GetPortMap() {
		n.PortMap[k] = int(v)
	}
	return n
}

var healthToProto = map[HealthState]driverspb.FingerprintResponse_HealthState{
	HealthStateUndetected: driverspb.FingerprintResponse_UNDETECTED,
	HealthStateUnhealthy:  driverspb.FingerprintResponse_UNHEALTHY,
	HealthStateHealthy:    driverspb.FingerprintResponse_HEALTHY,
}

// FingerprintToProto converts a fingerprint.
func FingerprintToProto(f *Fingerprint) *driverspb.FingerprintResponse {
	return &driverspb.FingerprintResponse{
		Attributes:        structs.AttributesToProto(f.Attributes),
		Health:            healthToProto[f.Health],
		HealthDescription: f.HealthDescription,
	}
}

// FingerprintFromProto converts a fingerprint.
func FingerprintFromProto(pb *driverspb.FingerprintResponse) *Fingerprint {
	f := &Fingerprint{Attributes: structs.AttributesFromProto(pb.GetAttributes()), Health: HealthStateUndetected, HealthDescription: pb.GetHealthDescription()}
	for h, p := range healthToProto {
		if p == pb.GetHealth() {
			f.Health = h
		}
	}
	return f
}

var fsIsolationToProto = map[FSIsolation]driverspb.DriverCapabilities_FSIsolation{
	FSIsolationNone:   driverspb.DriverCapabilities_NONE,
	FSIsolationChroot: driverspb.DriverCapabilities_CHROOT,
	FSIsolationImage:  driverspb.DriverCapabilities_IMAGE,
	FSIsolationUnveil: driverspb.DriverCapabilities_UNVEIL,
}

// CapabilitiesToProto converts capabilities.
func CapabilitiesToProto(c *Capabilities) *driverspb.DriverCapabilities {
	pb := &driverspb.DriverCapabilities{
		SendSignals:           c.SendSignals,
		Exec:                  c.Exec,
		FsIsolation:           fsIsolationToProto[c.FSIsolation],
		NetworkIsolationModes: []driverspb.NetworkIsolationSpec_NetworkIsolationMode{},
		MustCreateNetwork:     c.MustInitiateNetwork,
		MountConfigs:          driverspb.DriverCapabilities_MountConfigs(c.MountConfigs),
		DisableLogCollection:  c.DisableLogCollection,
		DynamicWorkloadUsers:  c.DynamicWorkloadUsers,
	}
	for _, m := range c.NetIsolationModes {
		pb.NetworkIsolationModes = append(pb.NetworkIsolationModes, netIsolationModeToProto(m))
	}
	return pb
}

// CapabilitiesFromProto converts capabilities.
func CapabilitiesFromProto(pb *driverspb.DriverCapabilities) *Capabilities {
	c := &Capabilities{
		SendSignals:          pb.GetSendSignals(),
		Exec:                 pb.GetExec(),
		FSIsolation:          FSIsolationNone,
		MustInitiateNetwork:  pb.GetMustCreateNetwork(),
		MountConfigs:         MountConfigSupport(pb.GetMountConfigs()),
		DisableLogCollection: pb.GetDisableLogCollection(),
		DynamicWorkloadUsers: pb.GetDynamicWorkloadUsers(),
	}
	for f, p := range fsIsolationToProto {
		if p == pb.GetFsIsolation() {
			c.FSIsolation = f
		}
	}
	for _, m := range pb.GetNetworkIsolationModes() {
		c.NetIsolationModes = append(c.NetIsolationModes, netIsolationModeFromProto(m))
	}
	return c
}

// TaskEventToProto converts a task event.
func TaskEventToProto(e *TaskEvent) *driverspb.DriverTaskEvent {
	return &driverspb.DriverTaskEvent{
		TaskId:      e.TaskID,
		AllocId:     e.AllocID,
		TaskName:    e.TaskName,
		Timestamp:   timestamppb.New(e.Timestamp),
		Message:     e.Message,
		Annotations: e.Annotations,
	}
}

// TaskEventFromProto converts a task event.
func TaskEventFromProto(pb *driverspb.DriverTaskEvent) *TaskEvent {
	return &TaskEvent{
		TaskID:      pb.GetTaskId(),
		AllocID:     pb.GetAllocId(),
		TaskName:    pb.GetTaskName(),
		Timestamp:   pb.GetTimestamp().AsTime(),
		Message:     pb.GetMessage(),
		Annotations: maps.Clone(pb.GetAnnotations()),
	}
}

// The names Nomad gives measured fields in its stats, in wire order.
var (
	cpuFields = []string{"System Mode", "User Mode", "Total Ticks", "Throttled Periods", "Throttled Time", "Percent"}
	memFields = []string{"RSS", "Cache", "Max Usage", "Kernel Usage", "Kernel Max Usage", "Usage", "Swap"}
)

func fieldIndex(names []string, name string) (int32, bool) {
	for i, n := range names {
		if n == name {
			return int32(i), true
		}
	}
	return 0, false
}

func resourceUsageToProto(ru *ResourceUsage) *driverspb.TaskResourceUsage {
	pb := &driverspb.TaskResourceUsage{Cpu: &driverspb.CPUUsage{}, Memory: &driverspb.MemoryUsage{}}
	if ru == nil {
		return pb
	}
	if c := ru.CpuStats; c != nil {
		pb.Cpu = &driverspb.CPUUsage{SystemMode: c.SystemMode, UserMode: c.UserMode, TotalTicks: c.TotalTicks,
			ThrottledPeriods: c.ThrottledPeriods, ThrottledTime: c.ThrottledTime, Percent: c.Percent}
		for _, f := range c.Measured {
			if i, ok := fieldIndex(cpuFields, f); ok {
				pb.Cpu.MeasuredFields = append(pb.Cpu.MeasuredFields, driverspb.CPUUsage_Fields(i))
			}
		}
	}
	if m := ru.MemoryStats; m != nil {
		pb.Memory = &driverspb.MemoryUsage{Rss: m.RSS, Cache: m.Cache, MaxUsage: m.MaxUsage, KernelUsage: m.KernelUsage,
			KernelMaxUsage: m.KernelMaxUsage, Usage: m.Usage, Swap: m.Swap}
		for _, f := range m.Measured {
			if i, ok := fieldIndex(memFields, f); ok {
				pb.Memory.MeasuredFields = append(pb.Memory.MeasuredFields, driverspb.MemoryUsage_Fields(i))
			}
		}
	}
	return pb
}

func resourceUsageFromProto(pb *driverspb.TaskResourceUsage) *ResourceUsage {
	ru := &ResourceUsage{CpuStats: &CpuStats{}, MemoryStats: &MemoryStats{}}
	if c := pb.GetCpu(); c != nil {
		ru.CpuStats = &CpuStats{SystemMode: c.GetSystemMode(), UserMode: c.GetUserMode(), TotalTicks: c.GetTotalTicks(),
			ThrottledPeriods: c.GetThrottledPeriods(), ThrottledTime: c.GetThrottledTime(), Percent: c.GetPercent()}
		for _, f := range c.GetMeasuredFields() {
			if int(f) < len(cpuFields) {
				ru.CpuStats.Measured = append(ru.CpuStats.Measured, cpuFields[f])
			}
		}
	}
	if m := pb.GetMemory(); m != nil {
		ru.MemoryStats = &MemoryStats{RSS: m.GetRss(), Cache: m.GetCache(), MaxUsage: m.GetMaxUsage(), KernelUsage: m.GetKernelUsage(),
			KernelMaxUsage: m.GetKernelMaxUsage(), Usage: m.GetUsage(), Swap: m.GetSwap()}
		for _, f := range m.GetMeasuredFields() {
			if int(f) < len(memFields) {
				ru.MemoryStats.Measured = append(ru.MemoryStats.Measured, memFields[f])
			}
		}
	}
	return ru
}

// TaskStatsToProto converts a task's resource usage.
func TaskStatsToProto(u *TaskResourceUsage) *driverspb.TaskStats {
	pb := &driverspb.TaskStats{
		Timestamp:          timestamppb.New(time.Unix(0, u.Timestamp)),
		AggResourceUsage:   resourceUsageToProto(u.ResourceUsage),
		ResourceUsageByPid: make(map[string]*driverspb.TaskResourceUsage, len(u.Pids)),
	}
	for pid, ru := range u.Pids {
		pb.ResourceUsageByPid[pid] = resourceUsageToProto(ru)
	}
	return pb
}

// TaskStatsFromProto converts a task's resource usage.
func TaskStatsFromProto(pb *driverspb.TaskStats) *TaskResourceUsage {
	u := &TaskResourceUsage{
		Timestamp:     pb.GetTimestamp().AsTime().UnixNano(),
		ResourceUsage: resourceUsageFromProto(pb.GetAggResourceUsage()),
		Pids:          make(map[string]*ResourceUsage, len(pb.GetResourceUsageByPid())),
	}
	for pid, ru := range pb.GetResourceUsageByPid() {
		u.Pids[pid] = resourceUsageFromProto(ru)
	}
	return u
}

func durationToProto(d time.Duration) *durationpb.Duration { return durationpb.New(d) }
