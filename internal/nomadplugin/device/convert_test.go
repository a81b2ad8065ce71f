package device

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"google.golang.org/protobuf/proto"

	devicepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

func ptr[T any](v T) *T { return &v }

// wire marshals m to bytes and back into a fresh message of its type, so a
// round trip crosses the binary encoding Nomad's client reads.
func wire[M proto.Message](t *testing.T, m M) M {
	t.Helper()
	b, err := proto.Marshal(m)
	must.NoError(t, err)
	out := m.ProtoReflect().New().Interface().(M)
	must.NoError(t, proto.Unmarshal(b, out))
	return out
}

func TestDeviceGroupsRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		in   []*DeviceGroup
	}{
		{"nil", nil},
		{"empty", []*DeviceGroup{}},
		{"bare group", []*DeviceGroup{{Vendor: "nvidia", Type: DeviceTypeGPU, Name: "A100"}}},
		{"full", []*DeviceGroup{{
			Vendor: "nvidia",
			Type:   DeviceTypeGPU,
			Name:   "NVIDIA A100-SXM4-40GB",
			Devices: []*Device{
				{ID: "GPU-1", Healthy: true, HwLocality: &DeviceLocality{PciBusID: "00000000:07:00.0"}},
				{ID: "GPU-2", Healthy: false, HealthDesc: "Xid 79"},
			},
			Attributes: map[string]*structs.Attribute{
				"memory":             structs.NewIntAttribute(40960, "MiB"),
				"driver_version":     structs.NewStringAttribute("550.54.15"),
				"ratio":              structs.NewFloatAttribute(0.5, ""),
				"mig":                structs.NewBoolAttribute(true),
				"compute_capability": structs.NewStringAttribute("8.0"),
			},
		}, {
			Vendor: "intel", Type: "fpga", Name: "x",
			Devices: []*Device{{ID: "f0", Healthy: true}},
		}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := &devicepb.FingerprintResponse{DeviceGroup: DeviceGroupsToProto(tc.in)}
			got := DeviceGroupsFromProto(wire(t, msg).GetDeviceGroup())
			if len(tc.in) == 0 {
				// The wire does not tell an empty list from none.
				must.SliceEmpty(t, got)
				return
			}
			must.Eq(t, tc.in, got)
		})
	}
}

func TestDeviceGroupsToProto_Fields(t *testing.T) {
	// The field names Nomad's client reads, set from the Go names.
	pb := DeviceGroupsToProto([]*DeviceGroup{{
		Vendor: "v", Type: "t", Name: "n",
		Devices: []*Device{{ID: "d", Healthy: true, HealthDesc: "ok", HwLocality: &DeviceLocality{PciBusID: "bus"}}},
	}})[0]
	must.Eq(t, "v", pb.GetVendor())
	must.Eq(t, "t", pb.GetDeviceType())
	must.Eq(t, "n", pb.GetDeviceName())
	d := pb.GetDevices()[0]
	must.Eq(t, "d", d.GetID())
	must.True(t, d.GetHealthy())
	must.Eq(t, "ok", d.GetHealthDescription())
	must.Eq(t, "bus", d.GetHwLocality().GetPciBusId())
}

func TestContainerReservationRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		in   *ContainerReservation
		want *ContainerReservation
	}{
		{"nil", nil, nil},
		{"empty", &ContainerReservation{}, &ContainerReservation{}},
		{"envs", &ContainerReservation{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"}}, nil},
		{"full", &ContainerReservation{
			Envs:    map[string]string{"A": "1", "B": ""},
			Mounts:  []*Mount{{TaskPath: "/usr/lib/x", HostPath: "/opt/x", ReadOnly: true}, {TaskPath: "/a", HostPath: "/b"}},
			Devices: []*DeviceSpec{{TaskPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", CgroupPerms: "rwm"}},
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil {
				want = tc.in
			}
			msg := &devicepb.ReserveResponse{ContainerRes: ContainerReservationToProto(tc.in)}
			must.Eq(t, want, ContainerReservationFromProto(wire(t, msg).GetContainerRes()))
		})
	}
}

func TestDeviceGroupStatsRoundTrip(t *testing.T) {
	ts := time.Date(2026, 11, 29, 13, 0, 0, 123456789, time.UTC)
	nested := &structs.StatObject{
		Nested: map[string]*structs.StatObject{
			"engine": {Attributes: map[string]*structs.StatValue{"busy": {IntNumeratorVal: ptr(int64(3))}}},
		},
		Attributes: map[string]*structs.StatValue{
			"Power usage":  {FloatNumeratorVal: ptr(250.5), FloatDenominatorVal: ptr(400.0), Unit: "W", Desc: "draw / limit"},
			"Memory state": {IntNumeratorVal: ptr(int64(1024)), IntDenominatorVal: ptr(int64(40960)), Unit: "MiB"},
			"Clock":        {StringVal: ptr("none")},
			"ECC":          {BoolVal: ptr(false)},
		},
	}
	cases := []struct {
		name string
		in   []*DeviceGroupStats
	}{
		{"nil", nil},
		{"group without instances", []*DeviceGroupStats{{Vendor: "nvidia", Type: "gpu", Name: "A100"}}},
		{"full", []*DeviceGroupStats{{
			Vendor: "nvidia", Type: "gpu", Name: "A100",
			InstanceStats: map[string]*DeviceStats{
				"GPU-1": {Summary: &structs.StatValue{FloatNumeratorVal: ptr(250.5), Unit: "W"}, Stats: nested, Timestamp: ts},
				"GPU-2": {Summary: &structs.StatValue{StringVal: ptr("N/A"), Unit: "W"}, Timestamp: ts},
			},
		}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := &devicepb.StatsResponse{Groups: DeviceGroupStatsToProto(tc.in)}
			must.Eq(t, tc.in, DeviceGroupStatsFromProto(wire(t, msg).GetGroups()))
		})
	}
}

func TestDeviceStatsFromProto_NoTimestamp(t *testing.T) {
	got := deviceStatsFromProto(&devicepb.DeviceStats{})
	must.True(t, got.Timestamp.IsZero())
	must.Nil(t, got.Summary)
}

func TestDeviceGroupValidate(t *testing.T) {
	cases := []struct {
		name    string
		group   DeviceGroup
		wantErr []string
	}{
		{"valid", DeviceGroup{Vendor: "nvidia", Type: "gpu", Name: "A100",
			Devices:    []*Device{{ID: "GPU-1"}},
			Attributes: map[string]*structs.Attribute{"memory": structs.NewIntAttribute(1, "MiB")}}, nil},
		{"missing names", DeviceGroup{}, []string{"vendor", "type", "name"}},
		{"device without id", DeviceGroup{Vendor: "v", Type: "t", Name: "n", Devices: []*Device{{}}}, []string{"device 0: device ID"}},
		{"nil device", DeviceGroup{Vendor: "v", Type: "t", Name: "n", Devices: []*Device{nil}}, []string{"device 0 is nil"}},
		{"empty attribute", DeviceGroup{Vendor: "v", Type: "t", Name: "n",
			Attributes: map[string]*structs.Attribute{"x": {}}}, []string{`"x"`}},
		{"unknown unit", DeviceGroup{Vendor: "v", Type: "t", Name: "n",
			Attributes: map[string]*structs.Attribute{"x": structs.NewIntAttribute(1, "furlongs")}}, []string{`"x"`, "furlongs"}},
		{"unit on a string", DeviceGroup{Vendor: "v", Type: "t", Name: "n",
			Attributes: map[string]*structs.Attribute{"x": {String: ptr("s"), Unit: "MiB"}}}, []string{`"x"`, "unit"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.group.Validate()
			if tc.wantErr == nil {
				must.NoError(t, err)
				return
			}
			for _, w := range tc.wantErr {
				must.ErrorContains(t, err, w)
			}
		})
	}
}
