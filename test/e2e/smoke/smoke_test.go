// Package smoke checks the test bed itself: a raw_exec job runs on the real Nomad agent, writes
// its output where Nomad's API reads it, and registers a passing service in the real Consul.
package smoke

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

// serveEnv makes the test binary itself the job's workload: a tiny HTTP server, so the smoke
// test needs nothing installed beyond Go.
const serveEnv = "OASIS_SMOKE_SERVE_ADDR"

func TestMain(m *testing.M) {
	if addr := os.Getenv(serveEnv); addr != "" {
		os.Exit(serve(addr))
	}
	os.Exit(testbed.Main(m, testbed.Options{}, &stack))
}

func serve(addr string) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen: %v\n", err)
		return 1
	}
	fmt.Printf("oasis-smoke pid %d serving on %s\n", os.Getpid(), addr)
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	if err := http.Serve(l, mux); err != nil {
		fmt.Fprintf(os.Stderr, "serve: %v\n", err)
		return 1
	}
	return 0
}

func smokeJob(testBinary string) string {
	return fmt.Sprintf(`
job "oasis-smoke" {
  datacenters = ["*"]
  type        = "service"

  group "web" {
    network {
      port "http" {}
    }

    service {
      name     = "oasis-smoke"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "smoke"]
      meta {
        oasis_test = "smoke"
      }
      check {
        type     = "http"
        path     = "/health"
        interval = "1s"
        timeout  = "1s"
      }
    }

    task "serve" {
      driver = "raw_exec"
      config {
        command = %q
        args    = ["-test.run=^$"]
      }
      env {
        %s = "${NOMAD_ADDR_http}"
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
`, testBinary, serveEnv)
}

func TestRawExecJobRunsAndRegistersInConsul(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	self, err := os.Executable()
	must.NoError(t, err)

	job, err := stack.RunJobHCL(ctx, smokeJob(self))
	must.NoError(t, err)
	allocs, err := stack.WaitAllocsRunning(ctx, *job.ID)
	must.NoError(t, err)
	must.Len(t, 1, allocs)

	alloc, _, err := stack.Nomad.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	must.Len(t, 1, alloc.AllocatedResources.Shared.Ports)
	port := alloc.AllocatedResources.Shared.Ports[0]
	must.Eq(t, "http", port.Label)
	addr := net.JoinHostPort(port.HostIP, strconv.Itoa(port.Value))

	// The task's stdout reaches Nomad's log API.
	var stdout string
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		stdout, err = stack.TaskLog(ctx, alloc.ID, "serve", "stdout")
		if err != nil {
			return err
		}
		if !strings.Contains(stdout, "serving on "+addr) {
			return fmt.Errorf("stdout %q does not name %s", stdout, addr)
		}
		return nil
	}), wait.Timeout(30*time.Second), wait.Gap(200*time.Millisecond)))
	var pid int
	_, err = fmt.Sscanf(stdout, "oasis-smoke pid %d", &pid)
	must.NoError(t, err)

	// The service is registered in Consul with its meta and a passing check on the allocated port.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		entries, _, err := stack.Consul.Health().Service("oasis-smoke", "", true, nil)
		if err != nil {
			return err
		}
		if len(entries) != 1 {
			return fmt.Errorf("%d passing instances of oasis-smoke", len(entries))
		}
		svc := entries[0].Service
		if svc.Port != port.Value || svc.Address != port.HostIP {
			return fmt.Errorf("registered at %s:%d, allocated %s", svc.Address, svc.Port, addr)
		}
		if svc.Meta["oasis_test"] != "smoke" {
			return fmt.Errorf("meta %v", svc.Meta)
		}
		return nil
	}), wait.Timeout(30*time.Second), wait.Gap(200*time.Millisecond)))

	resp, err := http.Get("http://" + addr + "/health")
	must.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.Eq(t, "ok", string(body))

	// Stopping the job ends the process and removes the registration.
	must.NoError(t, stack.StopJob(ctx, *job.ID))
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, fmt.Sprintf("task process %d to exit", pid), func() bool {
		return syscall.Kill(pid, 0) == syscall.ESRCH
	})
	testutil.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "oasis-smoke to leave Consul", func() bool {
		entries, _, err := stack.Consul.Health().Service("oasis-smoke", "", false, nil)
		return err == nil && len(entries) == 0
	})
}

func TestBatchJobOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job, err := stack.RunJobHCL(ctx, `
job "oasis-batch" {
  datacenters = ["*"]
  type        = "batch"
  group "g" {
    task "echo" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo batch-$NOMAD_JOB_NAME; echo to-stderr >&2; exit 3"]
      }
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
  }
}`)
	must.NoError(t, err)
	allocs, err := stack.WaitJobDone(ctx, *job.ID)
	must.NoError(t, err)
	must.Len(t, 1, allocs)
	must.Eq(t, "failed", allocs[0].ClientStatus)
	must.Eq(t, 3, exitCode(t, allocs[0].ID, "echo"))

	stdout, err := stack.TaskLog(ctx, allocs[0].ID, "echo", "stdout")
	must.NoError(t, err)
	must.Eq(t, "batch-oasis-batch\n", stdout)
	stderr, err := stack.TaskLog(ctx, allocs[0].ID, "echo", "stderr")
	must.NoError(t, err)
	must.Eq(t, "to-stderr\n", stderr)
}

func exitCode(t *testing.T, allocID, task string) int {
	t.Helper()
	alloc, _, err := stack.Nomad.Allocations().Info(allocID, nil)
	must.NoError(t, err)
	for _, e := range alloc.TaskStates[task].Events {
		if e.Type == "Terminated" {
			return e.ExitCode
		}
	}
	t.Fatalf("no Terminated event for task %s", task)
	return -1
}
