// Package devicemock runs the GPU device plugin's code against a mocked
// NVIDIA DGX A100 (internal/mocknvml, eight A100s with fixed
// readings) inside the test bed's real Nomad agent: the proof that Nomad
// reads what the plugin sends over Oasis's own implementation of the device
// plugin protocol — device groups with their attributes, health and PCI
// locality, per-device statistics, and the Reserve answer a task's
// environment carries — on a machine without GPUs.
package devicemock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/gobuild"
	"github.com/oasis-llm/oasis/internal/mocknvml"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// mockPlugin is the plugin (and binary file) name of the mocked-GPU plugin.
const mockPlugin = "nomad-device-gpu-mock"

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "devicemock-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "devicemock: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := gobuild.Commands(ctx, dir, "github.com/oasis-llm/oasis/device-plugin/internal/cmd/"+mockPlugin); err != nil {
		fmt.Fprintf(os.Stderr, "devicemock: building %s: %v\n", mockPlugin, err)
		return 1
	}
	return testbed.Main(m, testbed.Options{ExtraPlugins: map[string]string{mockPlugin: filepath.Join(dir, mockPlugin)}}, &stack)
}

// mockGroup waits until the node reports the mock's device group with all
// eight GPUs and returns it.
func mockGroup(t *testing.T) *nomadapi.NodeDeviceResource {
	t.Helper()
	var group *nomadapi.NodeDeviceResource
	testutil.EventuallyEvery(t, 60*time.Second, 250*time.Millisecond, "the node to report eight mocked A100s", func() bool {
		node, _, err := stack.Nomad.Nodes().Info(stack.NodeID, nil)
		if err != nil || node.NodeResources == nil {
			return false
		}
		for _, d := range node.NodeResources.Devices {
			if d.Vendor == "nvidia" && d.Type == "gpu" && d.Name == mocknvml.Model && len(d.Instances) == 8 {
				group = d
				return true
			}
		}
		return false
	})
	return group
}

func TestMockGPUs_Fingerprint(t *testing.T) {
	g := mockGroup(t)
	buses := map[string]bool{}
	for _, d := range g.Instances {
		must.StrHasPrefix(t, "GPU-", d.ID)
		must.True(t, d.Healthy, must.Sprintf("%s: %s", d.ID, d.HealthDescription))
		must.NotNil(t, d.Locality)
		buses[d.Locality.PciBusID] = true
	}
	must.MapLen(t, 8, buses, must.Sprint("each GPU carries its own PCI bus id"))

	intAttr := func(name string, want int64, unit string) {
		t.Helper()
		a := g.Attributes[name]
		must.NotNil(t, a, must.Sprint(name))
		must.NotNil(t, a.IntVal, must.Sprint(name))
		must.Eq(t, want, *a.IntVal, must.Sprint(name))
		must.Eq(t, unit, a.Unit, must.Sprint(name))
	}
	strAttr := func(name, want string) {
		t.Helper()
		a := g.Attributes[name]
		must.NotNil(t, a, must.Sprint(name))
		must.NotNil(t, a.StringVal, must.Sprint(name))
		must.Eq(t, want, *a.StringVal, must.Sprint(name))
	}
	intAttr("memory", 40960, "MiB")
	intAttr("bar1", mocknvml.BAR1Total>>20, "MiB")
	intAttr("power", mocknvml.LimitMW/1000, "W")
	intAttr("cores_clock", mocknvml.MaxGfxMHz, "MHz")
	intAttr("memory_clock", mocknvml.MaxMemMHz, "MHz")
	intAttr("pci_bandwidth", 32768, "MB/s")
	strAttr("compute_capability", "8.0")
	strAttr("driver_version", "550.54.15")
	strAttr("cuda_driver_version", "12.4")
	strAttr("persistence_mode", "Enabled")
	strAttr("display_state", "Disabled")

	// The real plugin beside it (no NVIDIA driver here) adds no group.
	node, _, err := stack.Nomad.Nodes().Info(stack.NodeID, nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, node.NodeResources.Devices)
}

func TestMockGPUs_Stats(t *testing.T) {
	g := mockGroup(t)
	ids := make([]string, len(g.Instances))
	for i, d := range g.Instances {
		ids[i] = d.ID
	}
	var stats *nomadapi.DeviceGroupStats
	testutil.EventuallyEvery(t, 30*time.Second, 250*time.Millisecond, "node stats with the eight GPUs' samples", func() bool {
		hs, err := stack.Nomad.Nodes().Stats(stack.NodeID, nil)
		if err != nil {
			return false
		}
		for _, s := range hs.DeviceStats {
			if s.Vendor == "nvidia" && s.Name == mocknvml.Model && len(s.InstanceStats) == 8 {
				stats = s
				return true
			}
		}
		return false
	})
	for _, id := range ids {
		st := stats.InstanceStats[id]
		must.NotNil(t, st, must.Sprint(id))
		must.NotNil(t, st.Summary.FloatNumeratorVal)
		must.Eq(t, float64(mocknvml.PowerMW)/1000, *st.Summary.FloatNumeratorVal)
		must.Eq(t, "W", st.Summary.Unit)
		attrs := st.Stats.Attributes
		must.Eq(t, float64(mocknvml.EnergyMJ)/1000, *attrs["Energy"].FloatNumeratorVal)
		must.Eq(t, float64(mocknvml.LimitMW)/1000, *attrs["Power limit"].FloatNumeratorVal)
		must.Eq(t, "sw_power_cap,hw_thermal_slowdown", *attrs["Clock event reasons"].StringVal)
		must.Eq(t, int64(mocknvml.MemUsed>>20), *attrs["Memory state"].IntNumeratorVal)
		must.Eq(t, int64(40960), *attrs["Memory state"].IntDenominatorVal)
		must.Eq(t, int64(mocknvml.TempC), *attrs["Temperature"].IntNumeratorVal)
		must.False(t, st.Timestamp.IsZero(), must.Sprint("the sample's timestamp crossed the wire"))
	}
}

// A job asking for two GPUs by attribute is placed on the mocked GPUs, and
// its task's environment carries the plugin's Reserve answer for exactly
// the devices Nomad allocated.
func TestMockGPUs_ReserveThroughAJob(t *testing.T) {
	mockGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := stack.RunJobHCL(ctx, `
job "two-gpus" {
  datacenters = ["*"]
  type        = "batch"
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"NVIDIA=$NVIDIA_VISIBLE_DEVICES CUDA=$CUDA_VISIBLE_DEVICES\""]
      }
      resources {
        device "nvidia/gpu" {
          count = 2
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "40 GiB"
          }
          constraint {
            attribute = "${device.attr.compute_capability}"
            operator  = "version"
            value     = ">= 8.0"
          }
        }
      }
    }
  }
}`)
	must.NoError(t, err)
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
		defer scancel()
		must.NoError(t, stack.StopJob(sctx, *job.ID))
	})
	allocs, err := stack.WaitJobDone(ctx, *job.ID)
	must.NoError(t, err)
	must.SliceLen(t, 1, allocs)
	must.Eq(t, "complete", allocs[0].ClientStatus)

	alloc, _, err := stack.Nomad.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	devs := alloc.AllocatedResources.Tasks["t"].Devices
	must.SliceLen(t, 1, devs)
	must.Eq(t, mocknvml.Model, devs[0].Name)
	must.SliceLen(t, 2, devs[0].DeviceIDs)

	out, err := stack.TaskLog(ctx, alloc.ID, "t", "stdout")
	must.NoError(t, err)
	var nv, cuda string
	_, err = fmt.Sscanf(strings.TrimSpace(out), "NVIDIA=%s CUDA=%s", &nv, &cuda)
	must.NoError(t, err, must.Sprintf("task output %q", out))
	// Nomad may hand Reserve the ids in any order; the plugin keeps it.
	must.Eq(t, nv, cuda)
	got := strings.Split(nv, ",")
	slices.Sort(got)
	want := slices.Clone(devs[0].DeviceIDs)
	slices.Sort(want)
	must.Eq(t, want, got)
}
