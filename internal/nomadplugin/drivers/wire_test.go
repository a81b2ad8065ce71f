package drivers

import (
	"encoding/hex"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	H "github.com/oasis-llm/oasis/internal/nomadplugin/proto/hclspec"
	S "github.com/oasis-llm/oasis/internal/nomadplugin/proto/structs"

	P "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
)

type protoMessage = proto.Message

// nomadGolden is what Nomad v1.6.3's own generated code (the module's
// plugins/drivers/proto) encodes for wireCases, deterministic marshalling,
// recorded from the module cache while the module was still in the graph.
var nomadGolden = map[string]string{
	"CapabilitiesResponse":      "0a1008011001180122020001280130014001",
	"DestroyTaskRequest":        "0a01781001",
	"DriverTaskEvent":           "0a0178120261311a06656e67696e65220b08c08df6d70610959aef3a2a0c456e67696e6520726561647932160a0e72656164795f61667465725f6d73120431322e35",
	"ExecTaskRequest":           "0a01781202736812022d631204747275651a05080510f403",
	"ExecTaskResponse":          "0a036f757412036572721a0708890110091801",
	"ExecTaskStreamingRequest":  "0a090a01781202736818011204081810501a070a036c730a1001",
	"ExecTaskStreamingResponse": "0a030a0161120210011801220708890110091801",
	"FingerprintResponse":       "0a210a166472697665722e6c6c6d2e73696d2e76657273696f6e12071a05302e312e300a0c0a016e12072a034d6942100710011a12656e67696e65733a2073696d20302e312e30",
	"InspectTaskResponse":       "0a300a01781206656e67696e651802220b08c08df6d70610959aef3a2a0b08c08df6d70610959aef3a320708890110091801121c0a0f0a066865616c7468120572656164790a090a03706964120234321a150a090a046874747010c03e120831302e302e302e32",
	"RecoverTaskRequest":        "0a017812a9040801129d040a0b61312f656e67696e652f781206656e67696e651a0c81a6656e67696e65a373696d22060a014112013122060a01421201322a1f0a164e56494449415f56495349424c455f4445564943455312054750552d31328a010a410a0308f40312061080021880042a320a0465746830120b31302e302e302e302f32341a0831302e302e302e3220642a050a01721050320a0a046874747010a0b701122b08a08d0610d0860318f403208080808001280a3203302d3141000000000000d03f4a082f6e6f6d61642f781a180a046874747010a0b70118c03e22093132372e302e302e313a130a022f6d12022f68180122077072697661746542210a0c2f6465762f6e766964696130120c2f6465762f6e7669646961301a0372776d4a066e6f626f647952132f7661722f6e6f6d61642f616c6c6f632f61315a322f7661722f6e6f6d61642f616c6c6f632f61312f616c6c6f632f6c6f67732f2e656e67696e652e7374646f75742e6669666f62322f7661722f6e6f6d61642f616c6c6f632f61312f616c6c6f632f6c6f67732f2e656e67696e652e7374646572722e6669666f6a016772036a6f627a02613182012c080112112f7661722f72756e2f6e65746e732f61311a060a016c120176220d0a0168120831302e302e302e328a01190a07312e312e312e3112056c6f63616c1a076e646f74733a329201066a6f622d69649a01026e73a201046e6f6465aa01076e6f64652d6964b20106706172656e7418012203820102",
	"SignalTaskRequest":         "0a01781206534947485550",
	"StartTaskRequest":          "0a9d040a0b61312f656e67696e652f781206656e67696e651a0c81a6656e67696e65a373696d22060a014112013122060a01421201322a1f0a164e56494449415f56495349424c455f4445564943455312054750552d31328a010a410a0308f40312061080021880042a320a0465746830120b31302e302e302e302f32341a0831302e302e302e3220642a050a01721050320a0a046874747010a0b701122b08a08d0610d0860318f403208080808001280a3203302d3141000000000000d03f4a082f6e6f6d61642f781a180a046874747010a0b70118c03e22093132372e302e302e313a130a022f6d12022f68180122077072697661746542210a0c2f6465762f6e766964696130120c2f6465762f6e7669646961301a0372776d4a066e6f626f647952132f7661722f6e6f6d61642f616c6c6f632f61315a322f7661722f6e6f6d61642f616c6c6f632f61312f616c6c6f632f6c6f67732f2e656e67696e652e7374646f75742e6669666f62322f7661722f6e6f6d61642f616c6c6f632f61312f616c6c6f632f6c6f67732f2e656e67696e652e7374646572722e6669666f6a016772036a6f627a02613182012c080112112f7661722f72756e2f6e65746e732f61311a060a016c120176220d0a0168120831302e302e302e328a01190a07312e312e312e3112056c6f63616c1a076e646f74733a329201066a6f622d69649a01026e73a201046e6f6465aa01076e6f64652d6964b20106706172656e74",
	"StartTaskResponse":         "08011201651aa9040801129d040a0b61312f656e67696e652f781206656e67696e651a0c81a6656e67696e65a373696d22060a014112013122060a01421201322a1f0a164e56494449415f56495349424c455f4445564943455312054750552d31328a010a410a0308f40312061080021880042a320a0465746830120b31302e302e302e302f32341a0831302e302e302e3220642a050a01721050320a0a046874747010a0b701122b08a08d0610d0860318f403208080808001280a3203302d3141000000000000d03f4a082f6e6f6d61642f781a180a046874747010a0b70118c03e22093132372e302e302e313a130a022f6d12022f68180122077072697661746542210a0c2f6465762f6e766964696130120c2f6465762f6e7669646961301a0372776d4a066e6f626f647952132f7661722f6e6f6d61642f616c6c6f632f61315a322f7661722f6e6f6d61642f616c6c6f632f61312f616c6c6f632f6c6f67732f2e656e67696e652e7374646f75742e6669666f62322f7661722f6e6f6d61642f616c6c6f632f61312f616c6c6f632f6c6f67732f2e656e67696e652e7374646572722e6669666f6a016772036a6f627a02613182012c080112112f7661722f72756e2f6e65746e732f61311a060a016c120176220d0a0168120831302e302e302e328a01190a07312e312e312e3112056c6f63616c1a076e646f74733a329201066a6f622d69649a01026e73a201046e6f6465aa01076e6f64652d6964b20106706172656e741801220382010222170a090a046874747010c03e120831302e302e302e321801",
	"StopTaskRequest":           "0a01781205080510f4031a06534947494e54",
	"TaskConfigSchemaResponse":  "0a141a120a06656e67696e651206737472696e671801",
	"TaskStatsRequest":          "0a01781205080510f403",
	"TaskStatsResponse":         "0aa8010a0178120b08c08df6d70610959aef3a1a470a2e09000000000000f83f110000000000000440190000000000000c4020042805310000000000001a403a04000102051215088080401002180320042805320300060538064007224d0a02343212470a2e09000000000000f83f110000000000000440190000000000000c4020042805310000000000001a403a04000102051215088080401002180320042805320300060538064007",
	"WaitTaskResponse":          "0a07088901100918011204626f6f6d",
}

// TestWireMatchesNomad: every message of the driver protocol, with every
// field both declarations share set, encodes byte for byte as Nomad's
// generated code did, and Nomad's bytes decode into Oasis's messages
// leaving no unknown field.
func TestWireMatchesNomad(t *testing.T) {
	cases := wireCases()
	if len(cases) != len(nomadGolden) {
		t.Fatalf("%d cases, %d goldens", len(cases), len(nomadGolden))
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != nomadGolden[name] {
				t.Fatalf("encoding differs from Nomad's:\n got %x\nwant %s", got, nomadGolden[name])
			}
			want, _ := hex.DecodeString(nomadGolden[name])
			back := m.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(want, back); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(back, m) {
				t.Fatalf("Nomad's bytes decode to %v, want %v", back, m)
			}
		})
	}
}

// wireCases are messages with every field Oasis and Nomad v1.6.3 share set,
// one per kind of call, as a Nomad client and the driver exchange them.
func wireCases() map[string]protoMessage {
	ts := &timestamppb.Timestamp{Seconds: 1795000000, Nanos: 123456789}
	dur := &durationpb.Duration{Seconds: 5, Nanos: 500}
	cfg := &P.TaskConfig{
		Id: "a1/engine/x", Name: "engine", MsgpackDriverConfig: []byte{0x81, 0xa6, 'e', 'n', 'g', 'i', 'n', 'e', 0xa3, 's', 'i', 'm'},
		Env: map[string]string{"A": "1", "B": "2"}, DeviceEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1"},
		Resources: &P.Resources{
			AllocatedResources: &P.AllocatedTaskResources{
				Cpu:    &P.AllocatedCpuResources{CpuShares: 500},
				Memory: &P.AllocatedMemoryResources{MemoryMb: 256, MemoryMaxMb: 512},
				Networks: []*P.NetworkResource{{Device: "eth0", Cidr: "10.0.0.0/24", Ip: "10.0.0.2", Mbits: 100,
					ReservedPorts: []*P.NetworkPort{{Label: "r", Value: 80}}, DynamicPorts: []*P.NetworkPort{{Label: "http", Value: 23456}}}},
			},
			LinuxResources: &P.LinuxResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 500, MemoryLimitBytes: 268435456,
				OomScoreAdj: 10, CpusetCpus: "0-1", PercentTicks: 0.25, CpusetCgroup: "/nomad/x"},
			Ports: []*P.PortMapping{{Label: "http", Value: 23456, To: 8000, HostIp: "127.0.0.1"}},
		},
		Mounts:  []*P.Mount{{TaskPath: "/m", HostPath: "/h", Readonly: true, PropagationMode: "private"}},
		Devices: []*P.Device{{TaskPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", CgroupPermissions: "rwm"}},
		User:    "nobody", AllocDir: "/var/nomad/alloc/a1",
		StdoutPath:    "/var/nomad/alloc/a1/alloc/logs/.engine.stdout.fifo",
		StderrPath:    "/var/nomad/alloc/a1/alloc/logs/.engine.stderr.fifo",
		TaskGroupName: "g", JobName: "job", AllocId: "a1",
		NetworkIsolationSpec: &P.NetworkIsolationSpec{Mode: P.NetworkIsolationSpec_GROUP, Path: "/var/run/netns/a1",
			Labels: map[string]string{"l": "v"}, HostsConfig: &P.HostsConfig{Hostname: "h", Address: "10.0.0.2"}},
		Dns:   &P.DNSConfig{Servers: []string{"1.1.1.1"}, Searches: []string{"local"}, Options: []string{"ndots:2"}},
		JobId: "job-id", Namespace: "ns", NodeName: "node", NodeId: "node-id", ParentJobId: "parent",
	}
	handle := &P.TaskHandle{Version: 1, Config: cfg, State: P.TaskState_RUNNING, DriverState: []byte{0x82, 0x01, 0x02}}
	exit := &P.ExitResult{ExitCode: 137, Signal: 9, OomKilled: true}
	usage := &P.TaskResourceUsage{
		Cpu: &P.CPUUsage{SystemMode: 1.5, UserMode: 2.5, TotalTicks: 3.5, ThrottledPeriods: 4, ThrottledTime: 5, Percent: 6.5,
			MeasuredFields: []P.CPUUsage_Fields{P.CPUUsage_SYSTEM_MODE, P.CPUUsage_USER_MODE, P.CPUUsage_TOTAL_TICKS, P.CPUUsage_PERCENT}},
		Memory: &P.MemoryUsage{Rss: 1048576, Cache: 2, MaxUsage: 3, KernelUsage: 4, KernelMaxUsage: 5, Usage: 6, Swap: 7,
			MeasuredFields: []P.MemoryUsage_Fields{P.MemoryUsage_RSS, P.MemoryUsage_SWAP, P.MemoryUsage_USAGE}},
	}
	return map[string]protoMessage{
		"StartTaskRequest": &P.StartTaskRequest{Task: cfg},
		"StartTaskResponse": &P.StartTaskResponse{Result: P.StartTaskResponse_RETRY, DriverErrorMsg: "e", Handle: handle,
			NetworkOverride: &P.NetworkOverride{PortMap: map[string]int32{"http": 8000}, Addr: "10.0.0.2", AutoAdvertise: true}},
		"RecoverTaskRequest": &P.RecoverTaskRequest{TaskId: "x", Handle: handle},
		"WaitTaskResponse":   &P.WaitTaskResponse{Result: exit, Err: "boom"},
		"StopTaskRequest":    &P.StopTaskRequest{TaskId: "x", Timeout: dur, Signal: "SIGINT"},
		"DestroyTaskRequest": &P.DestroyTaskRequest{TaskId: "x", Force: true},
		"InspectTaskResponse": &P.InspectTaskResponse{
			Task:            &P.TaskStatus{Id: "x", Name: "engine", State: P.TaskState_EXITED, StartedAt: ts, CompletedAt: ts, Result: exit},
			Driver:          &P.TaskDriverStatus{Attributes: map[string]string{"health": "ready", "pid": "42"}},
			NetworkOverride: &P.NetworkOverride{PortMap: map[string]int32{"http": 8000}, Addr: "10.0.0.2"}},
		"TaskStatsRequest": &P.TaskStatsRequest{TaskId: "x", CollectionInterval: dur},
		"TaskStatsResponse": &P.TaskStatsResponse{Stats: &P.TaskStats{Id: "x", Timestamp: ts, AggResourceUsage: usage,
			ResourceUsageByPid: map[string]*P.TaskResourceUsage{"42": usage}}},
		"DriverTaskEvent": &P.DriverTaskEvent{TaskId: "x", AllocId: "a1", TaskName: "engine", Timestamp: ts, Message: "Engine ready",
			Annotations: map[string]string{"ready_after_ms": "12.5"}},
		"CapabilitiesResponse": &P.CapabilitiesResponse{Capabilities: &P.DriverCapabilities{SendSignals: true, Exec: true,
			FsIsolation: P.DriverCapabilities_CHROOT, NetworkIsolationModes: []P.NetworkIsolationSpec_NetworkIsolationMode{P.NetworkIsolationSpec_HOST, P.NetworkIsolationSpec_GROUP},
			MustCreateNetwork: true, MountConfigs: P.DriverCapabilities_NO_MOUNTS, DisableLogCollection: true}},
		"FingerprintResponse": &P.FingerprintResponse{Attributes: map[string]*S.Attribute{
			"driver.llm.sim.version": {Value: &S.Attribute_StringVal{StringVal: "0.1.0"}},
			"n":                      {Value: &S.Attribute_IntVal{IntVal: 7}, Unit: "MiB"}},
			Health: P.FingerprintResponse_UNHEALTHY, HealthDescription: "engines: sim 0.1.0"},
		"SignalTaskRequest": &P.SignalTaskRequest{TaskId: "x", Signal: "SIGHUP"},
		"ExecTaskRequest":   &P.ExecTaskRequest{TaskId: "x", Command: []string{"sh", "-c", "true"}, Timeout: dur},
		"ExecTaskResponse":  &P.ExecTaskResponse{Stdout: []byte("out"), Stderr: []byte("err"), Result: exit},
		"ExecTaskStreamingRequest": &P.ExecTaskStreamingRequest{
			Setup:   &P.ExecTaskStreamingRequest_Setup{TaskId: "x", Command: []string{"sh"}, Tty: true},
			TtySize: &P.ExecTaskStreamingRequest_TerminalSize{Height: 24, Width: 80},
			Stdin:   &P.ExecTaskStreamingIOOperation{Data: []byte("ls\n"), Close: true}},
		"ExecTaskStreamingResponse": &P.ExecTaskStreamingResponse{Stdout: &P.ExecTaskStreamingIOOperation{Data: []byte("a")},
			Stderr: &P.ExecTaskStreamingIOOperation{Close: true}, Exited: true, Result: exit},
		"TaskConfigSchemaResponse": &P.TaskConfigSchemaResponse{Spec: &H.Spec{Block: &H.Spec_Attr{Attr: &H.Attr{Name: "engine", Type: "string", Required: true}}}},
	}
}
