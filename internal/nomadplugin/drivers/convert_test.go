package drivers

import (
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

var (
	t0 = time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)
	t1 = t0.Add(90 * time.Second)
)

func fullTaskConfig(t *testing.T) *TaskConfig {
	tc := &TaskConfig{
		ID: "a1/engine/x", JobName: "job", JobID: "job-id", TaskGroupName: "g", ParentJobID: "parent",
		Name: "engine", Namespace: "ns", NodeName: "node", NodeID: "node-id",
		Env: map[string]string{"A": "1"}, DeviceEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1"},
		Resources: &Resources{
			NomadResources: &AllocatedTaskResources{CPUShares: 500, MemoryMB: 256, MemoryMaxMB: 512},
			LinuxResources: &LinuxResources{CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 500, MemoryLimitBytes: 256 << 20,
				OOMScoreAdj: 10, CpusetCpus: "0-1", CpusetCgroupPath: "/sys/fs/cgroup/cpuset/nomad/x", PercentTicks: 0.25},
			Ports: []PortMapping{{Label: "http", Value: 23456, To: 8000, HostIP: "127.0.0.1"}},
		},
		Devices:    []*DeviceConfig{{TaskPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", Permissions: "rwm"}},
		Mounts:     []*MountConfig{{TaskPath: "/m", HostPath: "/h", Readonly: true, PropagationMode: "private", SELinuxLabel: "z"}},
		User:       "nobody",
		AllocDir:   "/var/nomad/alloc/a1",
		StdoutPath: "/var/nomad/alloc/a1/alloc/logs/.engine.stdout.fifo",
		StderrPath: "/var/nomad/alloc/a1/alloc/logs/.engine.stderr.fifo",
		AllocID:    "a1",
		NetworkIsolation: &NetworkIsolationSpec{Mode: NetIsolationModeGroup, Path: "/var/run/netns/a1",
			Labels: map[string]string{"l": "v"}, HostsConfig: &HostsConfig{Hostname: "h", Address: "10.0.0.2"}},
		DNS: &DNSConfig{Servers: []string{"1.1.1.1"}, Searches: []string{"local"}, Options: []string{"ndots:2"}},
	}
	if err := tc.EncodeConcreteDriverConfig(&struct {
		Engine string `codec:"engine"`
	}{"sim"}); err != nil {
		t.Fatal(err)
	}
	return tc
}

// TestConversionsRoundTrip: every type survives the trip to its wire
// message, through the wire bytes, and back.
func TestConversionsRoundTrip(t *testing.T) {
	tc := fullTaskConfig(t)
	cases := []struct {
		name string
		in   any
		trip func(t *testing.T, in any) any
	}{
		{"task config", tc, func(t *testing.T, in any) any {
			return TaskConfigFromProto(wire(t, TaskConfigToProto(in.(*TaskConfig))))
		}},
		{"task handle", &TaskHandle{Version: 1, Config: tc, State: TaskStateRunning, DriverState: []byte{1, 2}}, func(t *testing.T, in any) any {
			return TaskHandleFromProto(wire(t, TaskHandleToProto(in.(*TaskHandle))))
		}},
		{"exit result", &ExitResult{ExitCode: 3, Signal: 9, OOMKilled: true}, func(t *testing.T, in any) any {
			return ExitResultFromProto(wire(t, ExitResultToProto(in.(*ExitResult))))
		}},
		{"task status", &TaskStatus{ID: "x", Name: "engine", State: TaskStateExited, StartedAt: t0, CompletedAt: t1,
			ExitResult: &ExitResult{ExitCode: 1}}, func(t *testing.T, in any) any {
			return TaskStatusFromProto(wire(t, TaskStatusToProto(in.(*TaskStatus))))
		}},
		{"capabilities", &Capabilities{SendSignals: true, Exec: true, FSIsolation: FSIsolationNone,
			NetIsolationModes: []NetIsolationMode{NetIsolationModeHost, NetIsolationModeGroup}, MountConfigs: MountConfigSupportNone,
			DynamicWorkloadUsers: true}, func(t *testing.T, in any) any {
			return CapabilitiesFromProto(wire(t, CapabilitiesToProto(in.(*Capabilities))))
		}},
		{"fingerprint", &Fingerprint{Attributes: map[string]*structs.Attribute{"driver.llm.sim.version": structs.NewStringAttribute("0.1.0")},
			Health: HealthStateHealthy, HealthDescription: "engines: sim 0.1.0"}, func(t *testing.T, in any) any {
			return FingerprintFromProto(wire(t, FingerprintToProto(in.(*Fingerprint))))
		}},
		{"task stats", &TaskResourceUsage{Timestamp: t0.UnixNano(),
			ResourceUsage: &ResourceUsage{
				MemoryStats: &MemoryStats{RSS: 1 << 20, Swap: 2, Cache: 3, Usage: 4, MaxUsage: 5, KernelUsage: 6, KernelMaxUsage: 7,
					Measured: []string{"RSS", "Cache", "Max Usage", "Kernel Usage", "Kernel Max Usage", "Usage", "Swap"}},
				CpuStats: &CpuStats{SystemMode: 1, UserMode: 2, TotalTicks: 3, ThrottledPeriods: 4, ThrottledTime: 5, Percent: 6,
					Measured: []string{"System Mode", "User Mode", "Total Ticks", "Throttled Periods", "Throttled Time", "Percent"}},
			},
			Pids: map[string]*ResourceUsage{"42": {MemoryStats: &MemoryStats{RSS: 9, Measured: []string{"RSS"}}, CpuStats: &CpuStats{Percent: 1, Measured: []string{"Percent"}}}},
		}, func(t *testing.T, in any) any {
			return TaskStatsFromProto(wire(t, TaskStatsToProto(in.(*TaskResourceUsage))))
		}},
		{"task event", &TaskEvent{TaskID: "x", TaskName: "engine", AllocID: "a1", Timestamp: t0, Message: "Engine ready",
			Annotations: map[string]string{"ready_after_ms": "12.5"}}, func(t *testing.T, in any) any {
			return TaskEventFromProto(wire(t, TaskEventToProto(in.(*TaskEvent))))
		}},
		{"driver network", &DriverNetwork{PortMap: map[string]int{"http": 8000}, IP: "10.0.0.2", AutoAdvertise: true}, func(t *testing.T, in any) any {
			return DriverNetworkFromProto(wire(t, DriverNetworkToProto(in.(*DriverNetwork))))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.trip(t, c.in); !reflect.DeepEqual(got, c.in) {
				t.Fatalf("round trip changed the value:\n got %#v\nwant %#v", got, c.in)
			}
		})
	}
}

// wire marshals m and unmarshals it into a new message of its type.
func wire[M proto.Message](t *testing.T, m M) M {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := m.ProtoReflect().New().Interface().(M)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDriverConfigDecodes: the msgpack driver config a client sends is
// what DecodeDriverConfig reads.
func TestDriverConfigDecodes(t *testing.T) {
	tc := TaskConfigFromProto(wire(t, TaskConfigToProto(fullTaskConfig(t))))
	var got struct {
		Engine string `codec:"engine"`
	}
	if err := tc.DecodeDriverConfig(&got); err != nil {
		t.Fatal(err)
	}
	if got.Engine != "sim" {
		t.Fatalf("engine = %q, want sim", got.Engine)
	}
}

// TestWireNames pins the names and enum numbers Nomad's client matches on.
func TestWireNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string((&driverspb.TaskConfig{}).ProtoReflect().Descriptor().FullName()), "hashicorp.nomad.plugins.drivers.proto.TaskConfig"},
		{driverspb.Driver_StartTask_FullMethodName, "/hashicorp.nomad.plugins.drivers.proto.Driver/StartTask"},
		{driverspb.Driver_ExecTaskStreaming_FullMethodName, "/hashicorp.nomad.plugins.drivers.proto.Driver/ExecTaskStreaming"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	if CapabilitiesToProto(&Capabilities{MountConfigs: MountConfigSupportNone}).GetMountConfigs() != driverspb.DriverCapabilities_NO_MOUNTS {
		t.Error("MountConfigSupportNone is not NO_MOUNTS")
	}
	if netIsolationModeToProto(NetIsolationModeGroup) != driverspb.NetworkIsolationSpec_GROUP {
		t.Error("group isolation is not GROUP")
	}
}
