package deviceplugin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/device-plugin/pluginclient"
	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

func TestConfig_Decode(t *testing.T) {
	cases := []struct {
		name    string
		in      map[string]any
		want    Config
		wantErr string
	}{
		{
			name: "defaults",
			in:   nil,
			want: Config{Enabled: true, IgnoredGPUIDs: map[string]struct{}{}, FingerprintPeriod: time.Minute},
		},
		{
			name: "all set",
			in: map[string]any{
				"enabled": false, "ignored_gpu_ids": []string{"GPU-a", "MIG-b"},
				"fingerprint_period": "5s", "stats_period": "250ms",
			},
			want: Config{
				IgnoredGPUIDs:     map[string]struct{}{"GPU-a": {}, "MIG-b": {}},
				FingerprintPeriod: 5 * time.Second, StatsPeriod: 250 * time.Millisecond,
			},
		},
		{name: "bad fingerprint_period", in: map[string]any{"fingerprint_period": "soon"}, wantErr: `fingerprint_period "soon"`},
		{name: "zero fingerprint_period", in: map[string]any{"fingerprint_period": "0s"}, wantErr: "fingerprint_period"},
		{name: "negative stats_period", in: map[string]any{"stats_period": "-1s"}, wantErr: `stats_period "-1s": must be positive`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			buf, err := pluginclient.EncodeConfig(configSpec, tc.in)
			must.NoError(t, err)
			got, err := decodeConfig(buf)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
}

func TestConfig_UnknownKeyRejected(t *testing.T) {
	_, err := pluginclient.EncodeConfig(configSpec, map[string]any{"fingerprint_perod": "1s"})
	must.ErrorContains(t, err, "fingerprint_perod")
}

func TestFingerprint_Attributes(t *testing.T) {
	fx := newFixture(t)
	p, logs := newTestPlugin(t, fx.srv, nil)
	f := nextFingerprint(t, startFingerprint(t, p))
	must.StrContains(t, logs.String(), "GPUs detected: count=8")

	must.SliceLen(t, 1, f.Devices)
	g := f.Devices[0]
	must.Eq(t, "nvidia", g.Vendor)
	must.Eq(t, "gpu", g.Type)
	must.Eq(t, fxModel, g.Name)
	must.SliceLen(t, 8, g.Devices)
	for i, d := range g.Devices {
		must.True(t, d.Healthy)
		must.Eq(t, "", d.HealthDesc)
		must.StrHasPrefix(t, "GPU-", d.ID)
		if i > 0 {
			must.Less(t, d.ID, g.Devices[i-1].ID, must.Sprint("devices sorted by id"))
		}
		var bus string
		for _, fg := range fx.gpus {
			if fg.UUID == d.ID {
				bus = fg.PciBusID
			}
		}
		must.Eq(t, bus, d.HwLocality.PciBusID)
	}

	want := map[string]*structs.Attribute{
		AttrMemory:            structs.NewIntAttribute(40960, unitMiB),
		AttrBAR1:              structs.NewIntAttribute(65536, unitMiB),
		AttrPower:             structs.NewIntAttribute(400, unitW), // enforced limit, not draw
		AttrCoresClock:        structs.NewIntAttribute(fxMaxGfxMHz, unitMHz),
		AttrMemoryClock:       structs.NewIntAttribute(fxMaxMemMHz, unitMHz),
		AttrPCIBandwidth:      structs.NewIntAttribute(32768, unitMBPerS),
		AttrDisplayState:      structs.NewStringAttribute("Disabled"),
		AttrPersistenceMode:   structs.NewStringAttribute("Enabled"),
		AttrDriverVersion:     structs.NewStringAttribute("550.54.15"),
		AttrCUDADriverVersion: structs.NewStringAttribute("12.4"),
		AttrComputeCapability: structs.NewStringAttribute("8.0"),
	}
	must.MapLen(t, len(want), g.Attributes)
	for k, w := range want {
		got, ok := g.Attributes[k]
		must.True(t, ok, must.Sprintf("attribute %q missing", k))
		must.Eq(t, w.GoString(), got.GoString(), must.Sprintf("attribute %q", k))
	}
	must.NoError(t, g.Validate())
}

func TestFingerprint_OnlyOnChange(t *testing.T) {
	fx := newFixture(t)
	p, _ := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "10ms"})
	ch := startFingerprint(t, p)
	nextFingerprint(t, ch)
	// Ten rescans find nothing new: nothing is sent.
	noFingerprint(t, ch, 150*time.Millisecond)
}

func TestFingerprint_IgnoredGPUs(t *testing.T) {
	fx := newFixture(t)
	ignored := []string{fx.gpus[2].UUID, fx.gpus[5].UUID}
	p, _ := newTestPlugin(t, fx.srv, map[string]any{"ignored_gpu_ids": ignored})
	f := nextFingerprint(t, startFingerprint(t, p))
	must.SliceLen(t, 6, f.Devices[0].Devices)
	for _, id := range ignored {
		must.Nil(t, deviceByID(f, id))
	}
	// Ignored devices are not reservable either.
	_, err := p.Reserve([]string{ignored[0]})
	must.ErrorContains(t, err, "unknown device IDs: "+ignored[0])
}

func TestFingerprint_MIG(t *testing.T) {
	fx := newFixture(t)
	parent := fx.gpus[0]
	parent.MigMode = nvml.DEVICE_MIG_ENABLE
	migs := []struct {
		uuid, name string
		gi         int
		memMiB     uint64
	}{
		{"MIG-aaaa", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 1, 19968},
		{"MIG-bbbb", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 2, 4864},
	}
	parent.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	parent.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		m := migs[i]
		return &mock.Device{
			GetUUIDFunc:          func() (string, nvml.Return) { return m.uuid, nvml.SUCCESS },
			GetNameFunc:          func() (string, nvml.Return) { return m.name, nvml.SUCCESS },
			GetGpuInstanceIdFunc: func() (int, nvml.Return) { return m.gi, nvml.SUCCESS },
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
				return nvml.Memory{Total: m.memMiB << 20, Used: 7 << 20}, nvml.SUCCESS
			},
		}, nvml.SUCCESS
	}

	p, _ := newTestPlugin(t, fx.srv, nil)
	ch := startFingerprint(t, p)
	f := nextFingerprint(t, ch)

	must.SliceLen(t, 3, f.Devices, must.Sprint("A100 group + one group per MIG profile"))
	must.Nil(t, deviceByID(f, parent.UUID), must.Sprint("a MIG parent is not schedulable itself"))
	for _, m := range migs {
		d := deviceByID(f, m.uuid)
		must.NotNil(t, d)
		must.Eq(t, parent.PciBusID, d.HwLocality.PciBusID)
	}
	for _, g := range f.Devices {
		if g.Name == migs[1].name {
			must.Eq(t, structs.NewIntAttribute(4864, unitMiB).GoString(), g.Attributes[AttrMemory].GoString())
			must.Eq(t, "8.0", *g.Attributes[AttrComputeCapability].String)
		}
	}

	// An Xid on MIG instance 2 marks only that instance.
	fx.events <- nvml.EventData{Device: fx.srv.Devices[0], EventType: nvml.EventTypeXidCriticalError, EventData: 48, GpuInstanceId: 2}
	f = nextFingerprint(t, ch)
	must.False(t, deviceByID(f, "MIG-bbbb").Healthy)
	must.True(t, deviceByID(f, "MIG-aaaa").Healthy)

	// MIG instances report memory only.
	groups := p.collectStats(time.Now())
	for _, g := range groups {
		if st, ok := g.InstanceStats["MIG-aaaa"]; ok {
			must.Eq(t, int64(7), *st.Summary.IntNumeratorVal)
			must.Eq(t, int64(19968), *st.Summary.IntDenominatorVal)
			must.MapLen(t, 1, st.Stats.Attributes)
		}
	}

	res, err := p.Reserve([]string{"MIG-aaaa"})
	must.NoError(t, err)
	must.Eq(t, "MIG-aaaa", res.Envs["CUDA_VISIBLE_DEVICES"])
}

func TestFingerprint_NoNVMLLibrary(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	p, logs := newTestPlugin(t, lib, map[string]any{"fingerprint_period": "10ms"})
	ch := startFingerprint(t, p)

	f := nextFingerprint(t, ch)
	must.SliceEmpty(t, f.Devices)
	// The stream stays open and quiet while the plugin keeps retrying Init.
	noFingerprint(t, ch, 200*time.Millisecond)
	must.Greater(t, 5, len(lib.InitCalls()), must.Sprint("Init retried every fingerprint period"))
	must.Eq(t, 1, strings.Count(logs.String(), "libnvidia-ml.so.1 not found"), must.Sprint(logs.String()))

	// Stats stream empty samples instead of failing.
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sch, err := p.Stats(sctx, 10*time.Millisecond)
	must.NoError(t, err)
	s := <-sch
	must.NoError(t, s.Error)
	must.SliceEmpty(t, s.Groups)

	res, err := p.Reserve([]string{"GPU-x"})
	must.Nil(t, res)
	must.ErrorContains(t, err, "unknown device IDs: GPU-x")
}

func TestFingerprint_DriverAppearsLater(t *testing.T) {
	fx := newFixture(t)
	var ready atomicBool
	fx.srv.InitFunc = func() nvml.Return {
		if !ready.Load() {
			return nvml.ERROR_LIBRARY_NOT_FOUND
		}
		return nvml.SUCCESS
	}
	p, logs := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "10ms"})
	ch := startFingerprint(t, p)
	must.SliceEmpty(t, nextFingerprint(t, ch).Devices)
	ready.Store(true)
	f := nextFingerprint(t, ch)
	must.SliceLen(t, 8, f.Devices[0].Devices)
	must.StrContains(t, logs.String(), "GPUs detected")
}

func TestFingerprint_NoGPUs(t *testing.T) {
	fx := newFixture(t)
	fx.srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	p, logs := newTestPlugin(t, fx.srv, map[string]any{"fingerprint_period": "10ms"})
	ch := startFingerprint(t, p)
	must.SliceEmpty(t, nextFingerprint(t, ch).Devices)
	noFingerprint(t, ch, 100*time.Millisecond)
	must.Eq(t, 1, strings.Count(logs.String(), "NVML reports no NVIDIA GPUs"), must.Sprint(logs.String()))
}

func TestFingerprint_Disabled(t *testing.T) {
	fx := newFixture(t)
	p, _ := newTestPlugin(t, fx.srv, map[string]any{"enabled": false})
	_, err := p.Fingerprint(context.Background())
	must.Eq(t, device.ErrPluginDisabled, err)
	_, err = p.Stats(context.Background(), time.Second)
	must.Eq(t, device.ErrPluginDisabled, err)
	must.SliceEmpty(t, fx.srv.InitCalls(), must.Sprint("a disabled plugin never loads NVML"))
}

func TestReserve(t *testing.T) {
	fx := newFixture(t)
	p, _ := newTestPlugin(t, fx.srv, nil)
	nextFingerprint(t, startFingerprint(t, p))
	a, b := fx.gpus[1].UUID, fx.gpus[6].UUID

	cases := []struct {
		name     string
		ids      []string
		wantEnvs map[string]string
		wantErr  string
	}{
		{name: "none", ids: nil, wantEnvs: nil},
		{name: "one", ids: []string{a}, wantEnvs: map[string]string{"NVIDIA_VISIBLE_DEVICES": a, "CUDA_VISIBLE_DEVICES": a}},
		{name: "two in order", ids: []string{b, a}, wantEnvs: map[string]string{"NVIDIA_VISIBLE_DEVICES": b + "," + a, "CUDA_VISIBLE_DEVICES": b + "," + a}},
		{name: "unknown", ids: []string{a, "GPU-nope", "GPU-gone"}, wantErr: "unknown device IDs: GPU-nope,GPU-gone"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := p.Reserve(tc.ids)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				must.Nil(t, res)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.wantEnvs, res.Envs)
			must.SliceEmpty(t, res.Mounts)
			must.SliceEmpty(t, res.Devices)
		})
	}
}

func TestPluginInfo(t *testing.T) {
	p := New(testLogger(), &mock.Interface{})
	info, err := p.PluginInfo()
	must.NoError(t, err)
	must.Eq(t, base.PluginTypeDevice, info.Type)
	must.Eq(t, "nomad-device-gpu", info.Name)
	must.Eq(t, []string{device.ApiVersion010}, info.PluginApiVersions)
}
