package device

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	devicepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// The golden encodings below are what Nomad v1.6.3's own generated code
// (plugins/device/proto, the protocol Nomad 1.11 still speaks) produced for
// the same values, deterministic marshalling, recorded once from the module
// cache before Oasis dropped the module. A declaration whose field number,
// type or nesting drifted from Nomad's changes these bytes.
const (
	goldenFingerprint = "0a80010a066e766964696112036770751a044131303022190a054750552d311001220e0a0c303030303a30373a30302e30220f0a054750552d321a065869642037392a0b0a02636312051a03382e302a130a066d656d6f727912092a034d69421080c0022a090a036d6967120220012a120a05726174696f120909000000000000e03f"
	goldenStats       = "0abc010a066e766964696112036770751a044131303022a6010a054750552d31129c010a140a09090000000000506f403a015742046472617712770a180a06656e67696e65120e120c0a046275737912041a02080312110a05636c6f636b12082a060a046e6f6e65120b0a0365636312043202080112170a036d656d12101a0308800822040880c0023a034d694212220a05706f77657212190a09090000000000506f4012090900000000000079403a01571a0b08d0c3b0d80610959aef3a"
	goldenReserve     = "0a6f0a1d0a14435544415f56495349424c455f4445564943455312054750552d310a1f0a164e56494449415f56495349424c455f4445564943455312054750552d31120a0a022f7412022f6818011a210a0c2f6465762f6e766964696130120c2f6465762f6e7669646961301a0372776d"
	goldenReserveReq  = "0a054750552d310a054750552d32"
	goldenStatsReq    = "0a0808011080cab5ee01"
)

func goldenGroups() []*DeviceGroup {
	return []*DeviceGroup{{
		Vendor: "nvidia", Type: DeviceTypeGPU, Name: "A100",
		Devices: []*Device{
			{ID: "GPU-1", Healthy: true, HwLocality: &DeviceLocality{PciBusID: "0000:07:00.0"}},
			{ID: "GPU-2", Healthy: false, HealthDesc: "Xid 79"},
		},
		Attributes: map[string]*structs.Attribute{
			"memory": structs.NewIntAttribute(40960, "MiB"),
			"ratio":  structs.NewFloatAttribute(0.5, ""),
			"cc":     structs.NewStringAttribute("8.0"),
			"mig":    structs.NewBoolAttribute(true),
		},
	}}
}

func goldenGroupStats() []*DeviceGroupStats {
	return []*DeviceGroupStats{{
		Vendor: "nvidia", Type: DeviceTypeGPU, Name: "A100",
		InstanceStats: map[string]*DeviceStats{"GPU-1": {
			Summary: &structs.StatValue{FloatNumeratorVal: ptr(250.5), Unit: "W", Desc: "draw"},
			Stats: &structs.StatObject{
				Nested: map[string]*structs.StatObject{"engine": {Attributes: map[string]*structs.StatValue{"busy": {IntNumeratorVal: ptr(int64(3))}}}},
				Attributes: map[string]*structs.StatValue{
					"power": {FloatNumeratorVal: ptr(250.5), FloatDenominatorVal: ptr(400.0), Unit: "W"},
					"mem":   {IntNumeratorVal: ptr(int64(1024)), IntDenominatorVal: ptr(int64(40960)), Unit: "MiB"},
					"clock": {StringVal: ptr("none")},
					"ecc":   {BoolVal: ptr(true)},
				},
			},
			Timestamp: time.Unix(1795957200, 123456789).UTC(),
		}},
	}}
}

func goldenReservation() *ContainerReservation {
	return &ContainerReservation{
		Envs:    map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1", "NVIDIA_VISIBLE_DEVICES": "GPU-1"},
		Mounts:  []*Mount{{TaskPath: "/t", HostPath: "/h", ReadOnly: true}},
		Devices: []*DeviceSpec{{TaskPath: "/dev/nvidia0", HostPath: "/dev/nvidia0", CgroupPerms: "rwm"}},
	}
}

// TestWireMatchesNomad encodes Go values as the plugin's server does and
// compares the bytes with Nomad's; then decodes Nomad's bytes as the
// client side does and compares the values.
func TestWireMatchesNomad(t *testing.T) {
	cases := []struct {
		name   string
		golden string
		msg    proto.Message                       // what Oasis sends for the values
		empty  proto.Message                       // a message of the same type to decode into
		check  func(t *testing.T, m proto.Message) // the decoded golden bytes give the values back
	}{
		{"FingerprintResponse", goldenFingerprint,
			&devicepb.FingerprintResponse{DeviceGroup: DeviceGroupsToProto(goldenGroups())},
			&devicepb.FingerprintResponse{},
			func(t *testing.T, m proto.Message) {
				must.Eq(t, goldenGroups(), DeviceGroupsFromProto(m.(*devicepb.FingerprintResponse).GetDeviceGroup()))
			}},
		{"StatsResponse", goldenStats,
			&devicepb.StatsResponse{Groups: DeviceGroupStatsToProto(goldenGroupStats())},
			&devicepb.StatsResponse{},
			func(t *testing.T, m proto.Message) {
				must.Eq(t, goldenGroupStats(), DeviceGroupStatsFromProto(m.(*devicepb.StatsResponse).GetGroups()))
			}},
		{"ReserveResponse", goldenReserve,
			&devicepb.ReserveResponse{ContainerRes: ContainerReservationToProto(goldenReservation())},
			&devicepb.ReserveResponse{},
			func(t *testing.T, m proto.Message) {
				must.Eq(t, goldenReservation(), ContainerReservationFromProto(m.(*devicepb.ReserveResponse).GetContainerRes()))
			}},
		{"ReserveRequest", goldenReserveReq,
			&devicepb.ReserveRequest{DeviceIds: []string{"GPU-1", "GPU-2"}},
			&devicepb.ReserveRequest{},
			func(t *testing.T, m proto.Message) {
				must.Eq(t, []string{"GPU-1", "GPU-2"}, m.(*devicepb.ReserveRequest).GetDeviceIds())
			}},
		{"StatsRequest", goldenStatsReq,
			&devicepb.StatsRequest{CollectionInterval: durationpb.New(1500 * time.Millisecond)},
			&devicepb.StatsRequest{},
			func(t *testing.T, m proto.Message) {
				must.Eq(t, 1500*time.Millisecond, m.(*devicepb.StatsRequest).GetCollectionInterval().AsDuration())
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.msg)
			must.NoError(t, err)
			must.Eq(t, tc.golden, hex.EncodeToString(b))

			raw, err := hex.DecodeString(tc.golden)
			must.NoError(t, err)
			must.NoError(t, proto.Unmarshal(raw, tc.empty))
			must.SliceEmpty(t, tc.empty.ProtoReflect().GetUnknown(), must.Sprint("fields Oasis does not declare"))
			tc.check(t, tc.empty)
		})
	}
}
