package deviceplugin

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	plugin "github.com/hashicorp/go-plugin"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/device-plugin/pluginclient"
	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
)

// TestGRPCRoundTrip drives the plugin through the device plugin protocol's
// gRPC server and client (internal/nomadplugin/device, over go-plugin's
// in-process test connection), so every value crosses the wire encoding the
// Nomad client reads.
func TestGRPCRoundTrip(t *testing.T) {
	fx := newFixture(t)
	impl := New(testLogger(), fx.srv)
	impl.eventWait = 20 * time.Millisecond

	client, _ := plugin.TestPluginGRPCConn(t, true, map[string]plugin.Plugin{
		base.PluginTypeBase:   &base.PluginBase{Impl: impl},
		base.PluginTypeDevice: &device.PluginDevice{Impl: impl},
	})
	// Closing the client shuts the server down through go-plugin's controller;
	// stopping it here as well would race with that inside go-plugin.
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(base.PluginTypeDevice)
	must.NoError(t, err)
	dev, ok := raw.(device.DevicePlugin)
	must.True(t, ok)

	info, err := dev.PluginInfo()
	must.NoError(t, err)
	must.Eq(t, "nomad-device-gpu", info.Name)
	must.Eq(t, base.PluginTypeDevice, info.Type)

	spec, err := dev.ConfigSchema()
	must.NoError(t, err)
	ignored := fx.gpus[7].UUID
	cfg, err := pluginclient.EncodeConfig(spec, map[string]any{"ignored_gpu_ids": []string{ignored}, "stats_period": "20ms"})
	must.NoError(t, err)
	must.NoError(t, dev.SetConfig(&base.Config{PluginConfig: cfg, ApiVersion: device.ApiVersion010}))

	ch := startFingerprint(t, dev)
	f := nextFingerprint(t, ch)
	must.SliceLen(t, 1, f.Devices)
	g := f.Devices[0]
	must.NoError(t, g.Validate())
	must.Eq(t, fxModel, g.Name)
	must.SliceLen(t, 7, g.Devices)
	must.Nil(t, deviceByID(f, ignored))
	must.Eq(t, int64(400), *g.Attributes[AttrPower].Int)
	must.Eq(t, "W", g.Attributes[AttrPower].Unit)
	must.Eq(t, "12.4", *g.Attributes[AttrCUDADriverVersion].String)
	must.Eq(t, fx.gpus[0].PciBusID, deviceByID(f, fx.gpus[0].UUID).HwLocality.PciBusID)

	// Health crosses the wire too.
	fx.events <- nvml.EventData{Device: fx.srv.Devices[0], EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: noInstance}
	f = nextFingerprint(t, ch)
	d := deviceByID(f, fx.gpus[0].UUID)
	must.False(t, d.Healthy)
	must.StrContains(t, d.HealthDesc, "Xid 79")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sch, err := dev.Stats(ctx, time.Hour)
	must.NoError(t, err)
	var s *device.StatsResponse
	select {
	case s = <-sch:
	case <-time.After(5 * time.Second):
		t.Fatal("no stats")
	}
	must.NoError(t, s.Error)
	must.SliceLen(t, 1, s.Groups)
	st := s.Groups[0].InstanceStats[fx.gpus[1].UUID]
	must.NotNil(t, st)
	must.Eq(t, 250.5, *st.Summary.FloatNumeratorVal)
	must.Eq(t, "W", st.Summary.Unit)
	must.Eq(t, 123456.789, *st.Stats.Attributes[StatEnergy].FloatNumeratorVal)
	must.Eq(t, "sw_power_cap,hw_thermal_slowdown", *st.Stats.Attributes[StatClockEventReasons].StringVal)
	must.False(t, st.Timestamp.IsZero())
	// A second sample arrives at stats_period, not at Nomad's hour.
	select {
	case s = <-sch:
		must.NoError(t, s.Error)
	case <-time.After(5 * time.Second):
		t.Fatal("no second stats sample")
	}

	res, err := dev.Reserve([]string{fx.gpus[2].UUID})
	must.NoError(t, err)
	must.Eq(t, fx.gpus[2].UUID, res.Envs["NVIDIA_VISIBLE_DEVICES"])
	must.Eq(t, fx.gpus[2].UUID, res.Envs["CUDA_VISIBLE_DEVICES"])
	_, err = dev.Reserve([]string{ignored})
	must.ErrorContains(t, err, "unknown device IDs")
}
