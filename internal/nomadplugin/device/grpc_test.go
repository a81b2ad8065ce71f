package device

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	plugin "github.com/hashicorp/go-plugin"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// fakePlugin is a DevicePlugin whose streams the test drives: what it sends
// on fp/stats reaches the client, and the contexts it was given are kept so
// the test can see them end.
type fakePlugin struct {
	fp    chan *FingerprintResponse
	stats chan *StatsResponse

	mu        sync.Mutex
	fpCtx     context.Context
	interval  time.Duration
	config    *base.Config
	reserveFn func([]string) (*ContainerReservation, error)
	fpErr     error
}

func newFakePlugin() *fakePlugin {
	return &fakePlugin{fp: make(chan *FingerprintResponse), stats: make(chan *StatsResponse)}
}

func (f *fakePlugin) PluginInfo() (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{Type: base.PluginTypeDevice, PluginApiVersions: []string{ApiVersion010}, PluginVersion: "1.2.3", Name: "fake"}, nil
}

func (f *fakePlugin) ConfigSchema() (*hclspec.Spec, error) {
	return hclspec.NewObject(map[string]*hclspec.Spec{
		"enabled": hclspec.NewDefault(hclspec.NewAttr("enabled", "bool", false), hclspec.NewLiteral("true")),
	}), nil
}

func (f *fakePlugin) SetConfig(c *base.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.config = c
	return nil
}

func (f *fakePlugin) Fingerprint(ctx context.Context) (<-chan *FingerprintResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fpErr != nil {
		return nil, f.fpErr
	}
	f.fpCtx = ctx
	return f.fp, nil
}

func (f *fakePlugin) fingerprintCtx() context.Context {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fpCtx
}

func (f *fakePlugin) Reserve(ids []string) (*ContainerReservation, error) { return f.reserveFn(ids) }

func (f *fakePlugin) Stats(_ context.Context, interval time.Duration) (<-chan *StatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.interval = interval
	return f.stats, nil
}

// dial serves impl through go-plugin's in-memory gRPC connection and returns
// the client side, a DevicePlugin as pluginclient and Nomad get it.
func dial(t *testing.T, impl DevicePlugin) DevicePlugin {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		base.PluginTypeBase:   &base.PluginBase{Impl: impl},
		base.PluginTypeDevice: &PluginDevice{Impl: impl},
	})
	// Closing the client stops the server too; stopping both races in go-plugin.
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(base.PluginTypeDevice)
	must.NoError(t, err)
	dev, ok := raw.(DevicePlugin)
	must.True(t, ok, must.Sprintf("dispensed a %T", raw))
	return dev
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		must.True(t, ok, must.Sprint("channel closed"))
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received within 10s")
		var zero T
		return zero
	}
}

func send[T any](t *testing.T, ch chan<- T, v T) {
	t.Helper()
	select {
	case ch <- v:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not take the message within 10s")
	}
}

// waitClosed waits for ch to close, discarding what it still carries.
func waitClosed[T any](t *testing.T, ch <-chan T) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("channel not closed within 10s")
		}
	}
}

func TestGRPC_BaseAndConfig(t *testing.T) {
	impl := newFakePlugin()
	dev := dial(t, impl)

	info, err := dev.PluginInfo()
	must.NoError(t, err)
	must.Eq(t, "fake", info.Name)
	must.Eq(t, base.PluginTypeDevice, info.Type)
	must.Eq(t, []string{ApiVersion010}, info.PluginApiVersions)

	spec, err := dev.ConfigSchema()
	must.NoError(t, err)
	buf, err := hclspec.Encode(spec, map[string]any{"enabled": false})
	must.NoError(t, err)
	must.NoError(t, dev.SetConfig(&base.Config{PluginConfig: buf, ApiVersion: ApiVersion010}))
	impl.mu.Lock()
	got := impl.config
	impl.mu.Unlock()
	must.Eq(t, buf, got.PluginConfig)
	must.Eq(t, ApiVersion010, got.ApiVersion)
}

func TestGRPC_FingerprintStream(t *testing.T) {
	impl := newFakePlugin()
	dev := dial(t, impl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ch, err := dev.Fingerprint(ctx)
	must.NoError(t, err)
	groups := []*DeviceGroup{{
		Vendor: "nvidia", Type: DeviceTypeGPU, Name: "A100",
		Devices:    []*Device{{ID: "GPU-1", Healthy: true, HwLocality: &DeviceLocality{PciBusID: "0000:07:00.0"}}},
		Attributes: map[string]*structs.Attribute{"memory": structs.NewIntAttribute(40960, "MiB")},
	}}
	send(t, impl.fp, NewFingerprint(groups...))
	got := recv(t, ch)
	must.NoError(t, got.Error)
	must.Eq(t, groups, got.Devices)

	// A later change arrives on the same stream.
	groups[0].Devices[0].Healthy, groups[0].Devices[0].HealthDesc = false, "Xid 79"
	send(t, impl.fp, NewFingerprint(groups...))
	got = recv(t, ch)
	must.Eq(t, groups, got.Devices)

	// Cancelling the caller's context ends the plugin's stream context and
	// closes the client's channel.
	cancel()
	<-impl.fingerprintCtx().Done()
	waitClosed(t, ch)
}

func TestGRPC_FingerprintStreamEnds(t *testing.T) {
	impl := newFakePlugin()
	dev := dial(t, impl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The plugin closing its channel ends the stream without an error.
	ch, err := dev.Fingerprint(ctx)
	must.NoError(t, err)
	send(t, impl.fp, NewFingerprint())
	must.SliceEmpty(t, recv(t, ch).Devices)
	close(impl.fp)
	waitClosed(t, ch)
}

func TestGRPC_FingerprintErrors(t *testing.T) {
	impl := newFakePlugin()
	dev := dial(t, impl)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// An error response ends the stream with the error, recoverable flag kept.
	ch, err := dev.Fingerprint(ctx)
	must.NoError(t, err)
	send(t, impl.fp, NewFingerprintError(structs.NewRecoverableError(errors.New("nvml hiccup"), true)))
	got := recv(t, ch)
	must.ErrorContains(t, got.Error, "nvml hiccup")
	must.True(t, structs.IsRecoverable(got.Error))
	waitClosed(t, ch)

	// An error from opening the stream reaches the caller: with gRPC streams
	// it arrives as the first response.
	impl.mu.Lock()
	impl.fpErr = ErrPluginDisabled
	impl.mu.Unlock()
	ch, err = dev.Fingerprint(ctx)
	if err == nil {
		got = recv(t, ch)
		err = got.Error
		waitClosed(t, ch)
	}
	must.ErrorIs(t, err, ErrPluginDisabled)
	must.False(t, structs.IsRecoverable(err))
}

func TestGRPC_Stats(t *testing.T) {
	cases := []struct {
		name string
		ask  time.Duration
		want time.Duration
	}{
		{"interval passed through", 250 * time.Millisecond, 250 * time.Millisecond},
		{"zero defaults to a second", 0, time.Second},
		{"negative defaults to a second", -time.Second, time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			impl := newFakePlugin()
			dev := dial(t, impl)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, err := dev.Stats(ctx, tc.ask)
			must.NoError(t, err)
			sample := []*DeviceGroupStats{{Vendor: "nvidia", Type: "gpu", Name: "A100", InstanceStats: map[string]*DeviceStats{
				"GPU-1": {Summary: &structs.StatValue{FloatNumeratorVal: ptr(250.5), Unit: "W"}, Timestamp: time.Unix(1700000000, 5).UTC()},
			}}}
			send(t, impl.stats, &StatsResponse{Groups: sample})
			got := recv(t, ch)
			must.NoError(t, got.Error)
			must.Eq(t, sample, got.Groups)
			impl.mu.Lock()
			must.Eq(t, tc.want, impl.interval)
			impl.mu.Unlock()

			send(t, impl.stats, NewStatsError(errors.New("sensor gone")))
			got = recv(t, ch)
			must.ErrorContains(t, got.Error, "sensor gone")
			waitClosed(t, ch)
		})
	}
}

func TestGRPC_Reserve(t *testing.T) {
	unknown := errors.New("unknown device IDs: GPU-9")
	cases := []struct {
		name        string
		ids         []string
		res         *ContainerReservation
		err         error
		recoverable bool
	}{
		{"envs", []string{"GPU-1", "GPU-2"}, &ContainerReservation{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2"}}, nil, false},
		{"mounts and devices", []string{"GPU-1"}, &ContainerReservation{
			Mounts:  []*Mount{{TaskPath: "/t", HostPath: "/h", ReadOnly: true}},
			Devices: []*DeviceSpec{{TaskPath: "/dev/x", HostPath: "/dev/x", CgroupPerms: "rw"}},
		}, nil, false},
		{"error", []string{"GPU-9"}, nil, unknown, false},
		{"recoverable error", []string{"GPU-1"}, nil, structs.NewRecoverableError(errors.New("busy"), true), true},
		{"disabled", []string{"GPU-1"}, nil, ErrPluginDisabled, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			impl := newFakePlugin()
			var asked []string
			impl.reserveFn = func(ids []string) (*ContainerReservation, error) {
				asked = ids
				return tc.res, tc.err
			}
			dev := dial(t, impl)
			res, err := dev.Reserve(tc.ids)
			must.Eq(t, tc.ids, asked)
			if tc.err != nil {
				must.Nil(t, res)
				must.ErrorContains(t, err, tc.err.Error())
				if errors.Is(tc.err, ErrPluginDisabled) {
					must.ErrorIs(t, err, ErrPluginDisabled)
				}
				must.Eq(t, tc.recoverable, structs.IsRecoverable(err))
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.res, res)
		})
	}
}

func TestGRPC_ReserveTooManyIDs(t *testing.T) {
	impl := newFakePlugin()
	impl.reserveFn = func([]string) (*ContainerReservation, error) {
		t.Error("the plugin must not be asked")
		return nil, nil
	}
	dev := dial(t, impl)
	_, err := dev.Reserve(make([]string, maxReserveIDs+1))
	must.ErrorContains(t, err, "device_ids")
}
