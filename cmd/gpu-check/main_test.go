package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/device-plugin/pluginclient"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// pluginBin is the nomad-device-gpu binary built once for these tests.
var pluginBin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithCommand(m, "github.com/oasis-llm/oasis/cmd/nomad-device-gpu", &pluginBin))
}

// localGPUs says how many GPUs this machine's NVML reports (-1: no NVML).
func localGPUs(t *testing.T) int {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return -1
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	must.Eq(t, nvml.SUCCESS, ret)
	return n
}

func TestRun(t *testing.T) {
	gpus := localGPUs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var out, logs bytes.Buffer
	err := run(ctx, options{plugin: pluginBin, interval: 50 * time.Millisecond, samples: 2}, &out, &logs)
	if gpus <= 0 {
		must.ErrorContains(t, err, "the plugin reports no GPUs")
	} else {
		must.NoError(t, err, must.Sprint(logs.String()))
		must.Eq(t, gpus, strings.Count(out.String(), "    device "))
	}

	out.Reset()
	logs.Reset()
	err = run(ctx, options{plugin: pluginBin, interval: 50 * time.Millisecond, samples: 2, allowEmpty: true, jsonOut: true}, &out, &logs)
	must.NoError(t, err, must.Sprint(logs.String()))
	must.StrContains(t, out.String(), "plugin nomad-device-gpu 0.1.0")
	must.StrContains(t, out.String(), "stats sample 2:")
	if gpus < 0 {
		must.StrContains(t, out.String(), "fingerprint: 0 device group(s)")
		must.StrContains(t, logs.String(), "libnvidia-ml.so.1 not found")
	}
}

// The built binary, launched the way Nomad launches it, keeps running on a
// machine without NVIDIA driver or GPUs: it reports no devices once, logs
// why once, and stays quiet across many fingerprint periods.
func TestPluginBinary_StaysUpQuietlyWithoutGPUs(t *testing.T) {
	if localGPUs(t) > 0 {
		t.Skip("this machine has GPUs; TestRun covers it")
	}
	logs := &testutil.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := pluginclient.Launch(ctx, pluginBin, map[string]any{"fingerprint_period": "20ms"}, logger)
	must.NoError(t, err)
	defer c.Close()

	fch, err := c.Device.Fingerprint(ctx)
	must.NoError(t, err)
	f := <-fch
	must.NotNil(t, f)
	must.NoError(t, f.Error)
	must.SliceEmpty(t, f.Devices)

	select {
	case f, ok := <-fch:
		t.Fatalf("unexpected fingerprint (open=%t): %+v", ok, f)
	case <-time.After(time.Second): // 50 fingerprint periods
	}
	pid := c.Pid()
	must.Positive(t, pid)
	must.NoError(t, syscall.Kill(pid, 0), must.Sprint("plugin process must still run"))
	must.False(t, c.Exited())

	res, err := c.Device.Reserve([]string{"GPU-00000000-0000-0000-0000-000000000000"})
	must.Nil(t, res)
	must.ErrorContains(t, err, "unknown device IDs")

	text := logs.String()
	must.Eq(t, 1, strings.Count(text, "libnvidia-ml.so.1 not found"), must.Sprint(text))
}

// When the plugin process dies, the client side of the protocol ends its
// streams with device.ErrPluginShutdown and later calls fail with it: what
// gpu-check reports and what a caller can test for.
func TestPluginBinary_ExitEndsStreams(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := pluginclient.Launch(ctx, pluginBin, nil, hclog.NewNullLogger())
	must.NoError(t, err)
	defer c.Close()

	fch, err := c.Device.Fingerprint(ctx)
	must.NoError(t, err)
	f := <-fch
	must.NotNil(t, f)
	must.NoError(t, f.Error)
	sch, err := c.Device.Stats(ctx, 20*time.Millisecond)
	must.NoError(t, err)
	s := <-sch
	must.NotNil(t, s)
	must.NoError(t, s.Error)

	pid := c.Pid()
	must.Positive(t, pid)
	must.NoError(t, syscall.Kill(pid, syscall.SIGKILL))

	for name, errs := range map[string]<-chan error{
		"fingerprint": streamErr(fch, func(r *device.FingerprintResponse) error { return r.Error }),
		"stats":       streamErr(sch, func(r *device.StatsResponse) error { return r.Error }),
	} {
		select {
		case err := <-errs:
			must.ErrorIs(t, err, device.ErrPluginShutdown, must.Sprint(name))
		case <-time.After(10 * time.Second):
			t.Fatalf("%s stream: no error within 10s of the plugin's death", name)
		}
	}
	_, err = c.Device.Reserve([]string{"GPU-0"})
	must.ErrorIs(t, err, device.ErrPluginShutdown)
}

// streamErr delivers the first error a stream's responses carry, or nil
// when it closes without one.
func streamErr[R any](ch <-chan R, errOf func(R) error) <-chan error {
	out := make(chan error, 1)
	go func() {
		for r := range ch {
			if err := errOf(r); err != nil {
				out <- err
				return
			}
		}
		out <- nil
	}()
	return out
}
