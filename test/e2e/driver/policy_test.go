package driver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// policyJob is an llm task with the given config lines and task user whose
// template writes local/x.sh, a script that creates marker when it runs.
func policyJob(id, config, user, marker string) string {
	userLine := ""
	if user != "" {
		userLine = fmt.Sprintf("user   = %q", user)
	}
	return fmt.Sprintf(`
job %[1]q {
  datacenters = ["*"]
  type        = "service"
  group "engine" {
    network {
      port "http" {}
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
      %[3]s
      config {
        port = "http"
        %[2]s
      }
      template {
        destination = "local/x.sh"
        perms       = "0755"
        data        = "#!/bin/sh\ntouch %[4]s\nexec sleep 300\n"
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
`, id, config, userLine, marker)
}

// TestPolicy_RefusedWithFieldNamed: on a client whose plugin config sets no
// policy options, a task may not run its own executable (here a shell given
// a script the job's template wrote, as llama.cpp's "-m MODEL" argv makes
// `sh -m local/x.sh` run it), load code through extra_env, or run as root.
// `nomad-driver-llm validate` refuses each job naming the field; submitted
// anyway, the allocation fails without a restart, its task event names the
// field and the plugin option, and the script never runs.
func TestPolicy_RefusedWithFieldNamed(t *testing.T) {
	cases := []struct {
		name, config, user, want string
		// env is set as the task's extra_env through the API: Nomad's HCL parser turns
		// `extra_env = { ... }` into a list of maps, which the client's schema refuses
		// before the driver sees it.
		env map[string]interface{}
	}{
		{"task binary", `engine = "llama_cpp"
        model  = "local/x.sh"
        binary = "/bin/sh"`, "", `binary: "/bin/sh": a task may not choose the engine's executable; the client's plugin config does (binaries { llama_cpp = "..." }), or allows tasks to with allow_task_binary = true`, nil},
		{"LD_PRELOAD", `engine    = "sim"
        model     = "m"
        kv_events = false`, "", `extra_env: LD_PRELOAD is refused: dynamic loader variables (LD_*) load code of the job's choosing into the engine; the client's plugin config may allow it by name (allowed_env = ["LD_PRELOAD"])`,
			map[string]interface{}{"LD_PRELOAD": "/tmp/x.so"}},
		{"root user", `engine    = "sim"
        model     = "m"
        kv_events = false`, "root", `user: "root": tasks of driver llm run as root only where the client's plugin config sets default_user = "root"`, nil},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			jobID := fmt.Sprintf("oasis-driver-policy-%d", i)
			marker := filepath.Join(t.TempDir(), "ran")
			hcl := policyJob(jobID, tc.config, tc.user, marker)

			if tc.env == nil { // the pre-flight reads the job file (jobcheck's tests cover extra_env)
				jobFile := filepath.Join(t.TempDir(), "job.hcl")
				must.NoError(t, os.WriteFile(jobFile, []byte(hcl), 0o644))
				validate := exec.Command(stack.Bin("nomad-driver-llm"), "validate", "-address", stack.NomadAddr, jobFile)
				validate.Env = stack.Env()
				out, err := validate.CombinedOutput()
				var ee *exec.ExitError
				must.ErrorAs(t, err, &ee, must.Sprint(string(out)))
				must.EqOp(t, 1, ee.ExitCode())
				must.StrContains(t, string(out), `group "engine" task "engine": `+strings.SplitN(tc.want, ";", 2)[0])
			}

			job, err := stack.ParseJobHCL(hcl)
			must.NoError(t, err)
			if tc.env != nil {
				job.TaskGroups[0].Tasks[0].Config["extra_env"] = tc.env
			}
			_, _, err = stack.Nomad.Jobs().Register(job, nil)
			must.NoError(t, err)
			t.Cleanup(func() { _ = stack.StopJob(context.Background(), jobID) })
			allocs, err := stack.WaitJobDone(ctx, jobID)
			must.NoError(t, err)
			must.Len(t, 1, allocs)
			must.EqOp(t, "failed", allocs[0].ClientStatus)
			ev := waitEvent(t, allocs[0].ID, tc.want)
			must.EqOp(t, "Driver Failure", ev.Type)
			must.EqOp(t, uint64(0), allocs[0].TaskStates["engine"].Restarts)
			_, err = os.Stat(marker)
			must.True(t, os.IsNotExist(err), must.Sprint("the job's script ran"))
		})
	}
}

// TestPolicy_DefaultUser: a task that sets no user runs as the plugin's
// default_user, nobody: the engine's process has uid 65534 and the
// "Starting" event says so.
func TestPolicy_DefaultUser(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const jobID = "oasis-driver-default-user"
	_, err := stack.RunJobHCL(ctx, simJob(jobID, ""))
	must.NoError(t, err)
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), jobID) })
	alloc := runningAlloc(t, ctx, jobID)
	_, port := allocPort(t, alloc, "http")
	ev := waitEvent(t, alloc.ID, "Starting sim engine: ")
	must.EqOp(t, "nobody", ev.Details["user"])
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", enginePID(t, port)))
	must.NoError(t, err)
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 5 && f[0] == "Uid:" {
			must.Eq(t, []string{"65534", "65534", "65534", "65534"}, f[1:], must.Sprint("the engine's real, effective, saved and fs uids"))
			return
		}
	}
	t.Fatalf("no Uid line in /proc status: %s", status)
}
