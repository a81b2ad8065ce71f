package container

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

func runningAlloc(t *testing.T, ctx context.Context, jobID string) *nomadapi.Allocation {
	t.Helper()
	allocs, err := stack.WaitAllocsRunning(ctx, jobID)
	must.NoError(t, err)
	must.Len(t, 1, allocs)
	alloc, _, err := stack.Nomad.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	return alloc
}

func allocAddr(t *testing.T, alloc *nomadapi.Allocation, label string) string {
	t.Helper()
	for _, p := range alloc.AllocatedResources.Shared.Ports {
		if p.Label == label {
			return net.JoinHostPort(p.HostIP, strconv.Itoa(p.Value))
		}
	}
	t.Fatalf("allocation has no port %q", label)
	return ""
}

// waitEvent waits for a task event of the engine task containing substr.
func waitEvent(t *testing.T, allocID, substr string) *nomadapi.TaskEvent {
	t.Helper()
	var found *nomadapi.TaskEvent
	var seen []string
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		alloc, _, err := stack.Nomad.Allocations().Info(allocID, nil)
		if err != nil || alloc.TaskStates["engine"] == nil {
			return false
		}
		seen = seen[:0]
		for _, e := range alloc.TaskStates["engine"].Events {
			msg := e.DisplayMessage + " " + e.DriverMessage + " " + e.DriverError
			seen = append(seen, e.Type+": "+msg)
			if strings.Contains(msg, substr) {
				found = e
				return true
			}
		}
		return false
	}), wait.Timeout(90*time.Second), wait.Gap(100*time.Millisecond)), must.Func(func() string {
		return fmt.Sprintf("no task event containing %q; events: %q", substr, seen)
	}))
	return found
}

// streamChat sends a streaming chat completion and returns the content of
// its data lines; it fails unless the stream ends with [DONE].
func streamChat(t *testing.T, baseURL string) string {
	t.Helper()
	body := `{"model":"llama","stream":true,"messages":[{"role":"user","content":"Say hello"}],"max_tokens":8}`
	resp, err := http.Post(baseURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("chat: HTTP %d: %s", resp.StatusCode, b)
	}
	var chunks []string
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		chunks = append(chunks, line)
	}
	must.True(t, done, must.Sprint("stream ended without [DONE]; chunks: ", chunks))
	must.Positive(t, len(chunks))
	return strings.Join(chunks, "\n")
}

func taskLogs(t *testing.T, ctx context.Context, allocID string) string {
	t.Helper()
	out, err := stack.TaskLog(ctx, allocID, "engine", "stdout")
	must.NoError(t, err)
	errOut, err := stack.TaskLog(ctx, allocID, "engine", "stderr")
	must.NoError(t, err)
	return out + errOut
}

// TestImageEngine_ServesLogsRecoversStops is an image task's life cycle on a
// real agent: the driver starts the sim from an image in Podman (host
// networking), the engine answers a streamed chat through the router, its
// log reaches Nomad, a client restart re-attaches to the same container
// (RecoverTask) and stopping the job stops and removes the container.
func TestImageEngine_ServesLogsRecoversStops(t *testing.T) {
	buildSimImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	const jobID = "oasis-container-sim"
	_, err := stack.RunJobHCL(ctx, testbed.SimEngine{ID: jobID, Tags: []string{"container-e2e"},
		Config: fmt.Sprintf("image = %q", simImage)}.HCL())
	must.NoError(t, err)
	alloc := runningAlloc(t, ctx, jobID)
	addr := allocAddr(t, alloc, "http")

	ev := waitEvent(t, alloc.ID, "Starting sim engine from image "+simImage+": oasis-sim serve")
	must.StrContains(t, ev.DisplayMessage+ev.DriverMessage, "--port "+addr[strings.LastIndexByte(addr, ':')+1:])
	waitEvent(t, alloc.ID, "Loading model meta-llama/Llama-3.1-8B-Instruct (container ")
	waitEvent(t, alloc.ID, "Engine ready after")

	ctrs := newAPI().containersOf(t, alloc.ID)
	must.Len(t, 1, ctrs)
	ctr := ctrs[0]
	must.EqOp(t, "running", ctr.State)
	must.EqOp(t, "engine", ctr.Labels["io.oasis.task"])

	_, err = stack.WaitServicePassing(ctx, "oasis-engine", 1)
	must.NoError(t, err)
	router := startRouter(t, "container-e2e", "llama")
	streamChat(t, router)

	// The engine's log reaches Nomad through the task's FIFOs.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return strings.Contains(taskLogs(t, ctx, alloc.ID), "serving")
	}), wait.Timeout(30*time.Second), wait.Gap(200*time.Millisecond)), must.Func(func() string {
		return "task logs: " + taskLogs(t, ctx, alloc.ID)
	}))

	// Stats come from the container's cgroup.
	testutil.EventuallyEvery(t, 30*time.Second, 500*time.Millisecond, "a memory reading from the container's cgroup in the alloc's stats", func() bool {
		st, err := stack.Nomad.Allocations().Stats(alloc, nil)
		return err == nil && st.ResourceUsage != nil && st.ResourceUsage.MemoryStats != nil && st.ResourceUsage.MemoryStats.Usage > 0
	})

	// A client restart re-attaches to the same container: no restart.
	must.NoError(t, stack.RestartNomad(ctx))
	waitEvent(t, alloc.ID, "Reattached to engine (pid ")
	alloc = runningAlloc(t, ctx, jobID)
	must.EqOp(t, uint64(0), alloc.TaskStates["engine"].Restarts)
	ctrs = newAPI().containersOf(t, alloc.ID)
	must.Len(t, 1, ctrs)
	must.EqOp(t, ctr.ID, ctrs[0].ID)
	must.EqOp(t, "running", ctrs[0].State)
	streamChat(t, "http://"+addr)

	// Stopping the job signals the engine, which exits; the container goes.
	_, _, err = stack.Nomad.Jobs().Deregister(jobID, false, nil)
	must.NoError(t, err)
	defer func() { _ = stack.StopJob(context.Background(), jobID) }()
	// SIGTERM within kill_timeout: the engine drains and exits on its own,
	// not by the SIGKILL that follows an expired kill_timeout.
	stopped := waitEvent(t, alloc.ID, "Engine stopped (exit code")
	t.Logf("stop: %s", stopped.DisplayMessage)
	must.StrNotContains(t, stopped.DisplayMessage, "exit code 137")
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "the alloc to complete", func() bool {
		a, _, err := stack.Nomad.Allocations().Info(alloc.ID, nil)
		return err == nil && a.ClientStatus == "complete"
	})
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return len(newAPI().containersOf(t, alloc.ID)) == 0
	}), wait.Timeout(60*time.Second), wait.Gap(250*time.Millisecond)), must.Func(func() string {
		return fmt.Sprintf("containers left: %+v", newAPI().containersOf(t, alloc.ID))
	}))
}

// TestMissingImage_FailsWithClearEvent: an image neither in local storage
// nor pullable (no registry is reachable here) fails the task, and the
// event names the image and the pull's failure.
func TestMissingImage_FailsWithClearEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const jobID, image = "oasis-container-missing", "registry.invalid/oasis/no-such-engine:v0"
	_, err := stack.RunJobHCL(ctx, testbed.SimEngine{ID: jobID, Config: fmt.Sprintf("image = %q", image)}.HCL())
	must.NoError(t, err)
	defer func() { _ = stack.StopJob(context.Background(), jobID) }()
	var allocID string
	testutil.EventuallyEvery(t, 60*time.Second, 100*time.Millisecond, "the job's first allocation", func() bool {
		allocs, _, err := stack.Nomad.Jobs().Allocations(jobID, false, nil)
		if err != nil || len(allocs) == 0 {
			return false
		}
		allocID = allocs[0].ID
		return true
	})
	ev := waitEvent(t, allocID, "Image "+image+" is not available")
	must.StrContains(t, ev.DisplayMessage+ev.DriverMessage, "pull failed")
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "the alloc to fail", func() bool {
		a, _, err := stack.Nomad.Allocations().Info(allocID, nil)
		return err == nil && a.ClientStatus == "failed"
	})
}

// TestImageEngine_Bridge: in bridge networking the container joins the
// allocation's network namespace; the engine binds the port's "to" there,
// the driver's health check dials it from inside, and the mapped host port
// reaches it.
func TestImageEngine_Bridge(t *testing.T) {
	buildSimImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const jobID = "oasis-container-bridge"
	_, err := stack.RunJobHCL(ctx, fmt.Sprintf(`
job %q {
  datacenters = ["*"]
  type        = "service"
  group "engine" {
    network {
      mode = "bridge"
      port "http" { to = 8000 }
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "engine" {
      driver = "llm"
      config {
        engine            = "sim"
        model             = "m"
        served_model_name = "llama"
        port              = "http"
        kv_events         = false
        image             = %q
      }
      resources {
        cpu    = 200
        memory = 256
      }
    }
  }
}`, jobID, simImage))
	must.NoError(t, err)
	defer func() { _ = stack.StopJob(context.Background(), jobID) }()
	alloc := runningAlloc(t, ctx, jobID)
	ev := waitEvent(t, alloc.ID, "Starting sim engine from image ")
	must.StrContains(t, ev.DisplayMessage+ev.DriverMessage, "--host 0.0.0.0 --port 8000")
	waitEvent(t, alloc.ID, "Engine ready after")
	addr := allocAddr(t, alloc, "http")
	must.StrNotContains(t, addr, ":8000")
	streamChat(t, "http://"+addr)
}
