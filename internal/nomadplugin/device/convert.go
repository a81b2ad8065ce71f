package device

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	devicepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// Conversions between the Go types and the wire messages. Nil maps to nil
// both ways, and a nil element of a slice or map stays nil, so a round trip
// returns what went in.

// mapSlice converts every element of in with f; nil stays nil.
func mapSlice[In, Out any](in []In, f func(In) Out) []Out {
	if in == nil {
		return nil
	}
	out := make([]Out, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

// DeviceGroupsToProto converts fingerprinted groups to their wire form.
func DeviceGroupsToProto(in []*DeviceGroup) []*devicepb.DeviceGroup {
	return mapSlice(in, deviceGroupToProto)
}

func deviceGroupToProto(in *DeviceGroup) *devicepb.DeviceGroup {
	if in == nil {
		return nil
	}
	return &devicepb.DeviceGroup{
		Vendor:     in.Vendor,
		DeviceType: in.Type,
		DeviceName: in.Name,
		Devices:    mapSlice(in.Devices, deviceToProto),
		Attributes: structs.AttributesToProto(in.Attributes),
	}
}

func deviceToProto(in *Device) *devicepb.DetectedDevice {
	if in == nil {
		return nil
	}
	out := &devicepb.DetectedDevice{
		ID:                in.ID,
		Healthy:           in.Healthy,
		HealthDescription: in.HealthDesc,
	}
	if in.HwLocality != nil {
		out.HwLocality = &devicepb.DeviceLocality{PciBusId: in.HwLocality.PciBusID}
	}
	return out
}

// DeviceGroupsFromProto converts wire device groups to the Go types.
func DeviceGroupsFromProto(in []*devicepb.DeviceGroup) []*DeviceGroup {
	return mapSlice(in, deviceGroupFromProto)
}

func deviceGroupFromProto(in *devicepb.DeviceGroup) *DeviceGroup {
	if in == nil {
		return nil
	}
	return &DeviceGroup{
		Vendor:     in.GetVendor(),
		Type:       in.GetDeviceType(),
		Name:       in.GetDeviceName(),
		Devices:    mapSlice(in.GetDevices(), deviceFromProto),
		Attributes: structs.AttributesFromProto(in.GetAttributes()),
	}
}

func deviceFromProto(in *devicepb.DetectedDevice) *Device {
	if in == nil {
		return nil
	}
	out := &Device{
		ID:         in.GetID(),
		Healthy:    in.GetHealthy(),
		HealthDesc: in.GetHealthDescription(),
	}
	if l := in.GetHwLocality(); l != nil {
		out.HwLocality = &DeviceLocality{PciBusID: l.GetPciBusId()}
	}
	return out
}

// ContainerReservationToProto converts a reservation to its wire form.
func ContainerReservationToProto(in *ContainerReservation) *devicepb.ContainerReservation {
	if in == nil {
		return nil
	}
	return &devicepb.ContainerReservation{
		Envs: in.Envs,
		Mounts: mapSlice(in.Mounts, func(m *Mount) *devicepb.Mount {
			if m == nil {
				return nil
			}
			return &devicepb.Mount{TaskPath: m.TaskPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly}
		}),
		Devices: mapSlice(in.Devices, func(d *DeviceSpec) *devicepb.DeviceSpec {
			if d == nil {
				return nil
			}
			return &devicepb.DeviceSpec{TaskPath: d.TaskPath, HostPath: d.HostPath, Permissions: d.CgroupPerms}
		}),
	}
}

// ContainerReservationFromProto converts a wire reservation to the Go type.
func ContainerReservationFromProto(in *devicepb.ContainerReservation) *ContainerReservation {
	if in == nil {
		return nil
	}
	return &ContainerReservation{
		Envs: in.GetEnvs(),
		Mounts: mapSlice(in.GetMounts(), func(m *devicepb.Mount) *Mount {
			if m == nil {
				return nil
			}
			return &Mount{TaskPath: m.GetTaskPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadOnly()}
		}),
		Devices: mapSlice(in.GetDevices(), func(d *devicepb.DeviceSpec) *DeviceSpec {
			if d == nil {
				return nil
			}
			return &DeviceSpec{TaskPath: d.GetTaskPath(), HostPath: d.GetHostPath(), CgroupPerms: d.GetPermissions()}
		}),
	}
}

// DeviceGroupStatsToProto converts a stats sample to its wire form.
func DeviceGroupStatsToProto(in []*DeviceGroupStats) []*devicepb.DeviceGroupStats {
	return mapSlice(in, func(g *DeviceGroupStats) *devicepb.DeviceGroupStats {
		if g == nil {
			return nil
		}
		out := &devicepb.DeviceGroupStats{Vendor: g.Vendor, Type: g.Type, Name: g.Name}
		if g.InstanceStats != nil {
			out.InstanceStats = make(map[string]*devicepb.DeviceStats, len(g.InstanceStats))
			for id, s := range g.InstanceStats {
				out.InstanceStats[id] = deviceStatsToProto(s)
			}
		}
		return out
	})
}

func deviceStatsToProto(in *DeviceStats) *devicepb.DeviceStats {
	if in == nil {
		return nil
	}
	return &devicepb.DeviceStats{
		Summary:   structs.StatValueToProto(in.Summary),
		Stats:     structs.StatObjectToProto(in.Stats),
		Timestamp: timestamppb.New(in.Timestamp),
	}
}

// DeviceGroupStatsFromProto converts a wire stats sample to the Go types.
func DeviceGroupStatsFromProto(in []*devicepb.DeviceGroupStats) []*DeviceGroupStats {
	return mapSlice(in, func(g *devicepb.DeviceGroupStats) *DeviceGroupStats {
		if g == nil {
			return nil
		}
		out := &DeviceGroupStats{Vendor: g.GetVendor(), Type: g.GetType(), Name: g.GetName()}
		if g.InstanceStats != nil {
			out.InstanceStats = make(map[string]*DeviceStats, len(g.InstanceStats))
			for id, s := range g.InstanceStats {
				out.InstanceStats[id] = deviceStatsFromProto(s)
			}
		}
		return out
	})
}

func deviceStatsFromProto(in *devicepb.DeviceStats) *DeviceStats {
	if in == nil {
		return nil
	}
	out := &DeviceStats{
		Summary: structs.StatValueFromProto(in.GetSummary()),
		Stats:   structs.StatObjectFromProto(in.GetStats()),
	}
	// A missing or out-of-range timestamp leaves the zero time.
	if ts := in.GetTimestamp(); ts != nil && ts.IsValid() {
		out.Timestamp = ts.AsTime()
	}
	return out
}
