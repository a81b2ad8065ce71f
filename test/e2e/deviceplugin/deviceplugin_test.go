// Package deviceplugin checks nomad-device-gpu inside a real Nomad agent on a
// machine without NVIDIA driver or GPU: the agent loads it, the node stays
// ready, the plugin reports no devices, says why once and keeps running, and
// the scheduler refuses a job that asks for an nvidia/gpu.
package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }

const noDriverLine = "libnvidia-ml.so.1 not found"

func nomadLog(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(stack.Dir, "nomad.log"))
	must.NoError(t, err)
	return string(data)
}

// pluginPIDs lists running processes whose executable is the installed plugin.
func pluginPIDs(t *testing.T) []string {
	t.Helper()
	want := filepath.Join(stack.PluginDir, "nomad-device-gpu")
	entries, err := os.ReadDir("/proc")
	must.NoError(t, err)
	var pids []string
	for _, e := range entries {
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err == nil && exe == want {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

func TestDevicePlugin_GPULessNode(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver; the test covers GPU-less nodes")
	}
	_, err := os.Stat(filepath.Join(stack.PluginDir, "nomad-device-gpu"))
	must.NoError(t, err, must.Sprint("the test bed installs the plugin"))

	// The agent loaded the plugin under its PluginInfo name. must.Func: a
	// failure shows the log as it was at the deadline.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return strings.Contains(nomadLog(t), "detected plugin: name=nomad-device-gpu type=device")
	}), wait.Timeout(30*time.Second), wait.Gap(200*time.Millisecond)), must.Func(stack.NomadLog))

	// The device manager started it, and it said once why there are no GPUs.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return strings.Contains(nomadLog(t), noDriverLine)
	}), wait.Timeout(60*time.Second), wait.Gap(250*time.Millisecond)), must.Func(stack.NomadLog))

	// Several stats intervals to misbehave in: the device manager asks the
	// plugin for stats on the client's stats collection interval (1s), the
	// one it samples host stats on, from its first fingerprint on. Six
	// distinct host samples after the line above span at least five.
	// (The API's HostStats leaves out the sample's Timestamp.)
	samples, since := map[int64]bool{}, time.Now()
	testutil.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "six host stats samples from the Nomad client", func() bool {
		var st struct{ Timestamp int64 }
		if _, err := stack.Nomad.Raw().Query("/v1/client/stats?node_id="+stack.NodeID, &st, nil); err == nil && st.Timestamp != 0 {
			samples[st.Timestamp] = true
		}
		return len(samples) >= 6
	})
	t.Logf("six host stats samples after %v", time.Since(since).Round(10*time.Millisecond))

	log := nomadLog(t)
	must.Eq(t, 1, strings.Count(log, noDriverLine), must.Sprint("logged once, not per period"))
	for _, bad := range []string{
		"fingerprinting returned an error",
		"fingerprinting failed",
		"stats returned an error",
		"plugin exited unexpectedly",
		"dispensing plugin failed",
		"failed to fingerprint plugin",
	} {
		must.StrNotContains(t, log, bad)
	}
	must.SliceLen(t, 1, pluginPIDs(t), must.Sprint("one plugin process keeps running"))

	node, _, err := stack.Nomad.Nodes().Info(stack.NodeID, nil)
	must.NoError(t, err)
	must.Eq(t, "ready", node.Status)
	must.NotNil(t, node.NodeResources)
	must.SliceEmpty(t, node.NodeResources.Devices, must.Sprint("no GPU, no device group"))
	must.True(t, node.Drivers["raw_exec"].Healthy)

	// Node stats carry no device stats, and asking for them is not an error.
	stats, err := stack.Nomad.Nodes().Stats(stack.NodeID, nil)
	must.NoError(t, err)
	for _, g := range stats.DeviceStats {
		must.False(t, g.Vendor == "nvidia", must.Sprintf("unexpected nvidia stats: %+v", g))
	}
}

// A job that asks for a GPU is not placed on the GPU-less node: the scheduler
// sees the node's (empty) nvidia/gpu inventory the plugin reported.
func TestDevicePlugin_GPUJobNotPlaced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := stack.RunJobHCL(ctx, `
job "wants-gpu" {
  datacenters = ["*"]
  type        = "batch"
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
      resources {
        device "nvidia/gpu" {
          count = 1
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

	var failed *nomadapi.AllocationMetric
	testutil.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "the job's evaluation to record the failed placement", func() bool {
		evals, _, err := stack.Nomad.Jobs().Evaluations(*job.ID, nil)
		if err != nil {
			return false
		}
		for _, e := range evals {
			if m := e.FailedTGAllocs["g"]; m != nil {
				failed = m
				return true
			}
		}
		return false
	})
	allocs, _, err := stack.Nomad.Jobs().Allocations(*job.ID, true, nil)
	must.NoError(t, err)
	must.SliceEmpty(t, allocs)
	reasons := []string{}
	for k := range failed.ConstraintFiltered {
		reasons = append(reasons, k)
	}
	for k := range failed.DimensionExhausted {
		reasons = append(reasons, k)
	}
	must.StrContains(t, strings.Join(reasons, ";"), "devices", must.Sprintf("placement failure: %+v", failed))
}
