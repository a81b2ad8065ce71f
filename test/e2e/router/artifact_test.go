package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// distCmd builds a release tarball of one command with scripts/dist.sh and serves its directory
// over HTTP, as a release download would be. It returns the tarball's URL and its
// checksum in the jobs' sha256:<hex> form, read from SHA256SUMS.
func distCmd(t *testing.T, root, name string) (url, checksum string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts", "dist.sh"))
	cmd.Env = append(os.Environ(), "OASIS_VERSION=e2e", "DIST_ARCHES="+runtime.GOARCH,
		"DIST_CMDS="+name, "DIST_DIR="+dir)
	out, err := cmd.CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	must.NoError(t, err)
	fields := strings.Fields(string(sums))
	must.SliceLen(t, 2, fields)
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.URL + "/" + fields[1], "sha256:" + fields[0]
}

// TestRouterJobFromArtifact runs jobs/router.nomad.hcl with artifact_url and artifact_checksum:
// Nomad downloads the release tarball, verifies it and runs the router from the task directory,
// and a tarball that does not match the checksum never starts.
func TestRouterJobFromArtifact(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	url, checksum := distCmd(t, root, "oasis-router")
	port, err := testutil.FreePorts(1)
	must.NoError(t, err)
	vars := map[string]string{"http_port": strconv.Itoa(port[0]), "consul_addr": stack.ConsulAddr,
		"nomad_addr": stack.NomadAddr, "kv_prefix": "oasis-e2e/artifact",
		"artifact_url": url, "artifact_checksum": checksum}
	job := filepath.Join(root, "jobs", "router.nomad.hcl")
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), "oasis-router") })

	must.NoError(t, stack.RunJobFile(ctx, job, vars))
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port[0]) + "/health")
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	allocs, _, err := stack.Nomad.Jobs().Allocations("oasis-router", false, nil)
	must.NoError(t, err)
	must.SliceNotEmpty(t, allocs)
	alloc, _, err := stack.Nomad.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	must.Eq(t, "local/oasis/oasis-router", alloc.Job.TaskGroups[0].Tasks[0].Config["command"])
	must.True(t, runsFrom(t, "/"+alloc.ID+"/router/local/oasis/oasis-router"),
		must.Sprint("no process runs the fetched oasis-router"))
	must.NoError(t, stack.StopJob(ctx, "oasis-router"))

	// The same tarball against another checksum: the download is refused before the task starts.
	vars["artifact_checksum"] = "sha256:" + strings.Repeat("0", 64)
	parsed, err := stack.ParseJobFile(job, vars)
	must.NoError(t, err)
	_, _, err = stack.Nomad.Jobs().Register(parsed, nil)
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		return artifactFailed(t, "oasis-router")
	}), wait.Timeout(90*time.Second), wait.Gap(500*time.Millisecond)))
}

// TestSimRecipeFromArtifact runs recipes/tiny/sim/agg with artifact_url and artifact_checksum: the
// llm driver starts the oasis-sim Nomad fetched into the task directory (the recipe names it as
// the task's binary, so no other copy can serve), and the engine passes its Consul check.
func TestSimRecipeFromArtifact(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	url, checksum := distCmd(t, root, "oasis-sim")
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), "tiny-sim-agg") })
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "recipes", "tiny", "sim", "agg", "job.nomad.hcl"),
		map[string]string{"count": "1", "speed": "0", "artifact_url": url, "artifact_checksum": checksum}))
	allocs, _, err := stack.Nomad.Jobs().Allocations("tiny-sim-agg", false, nil)
	must.NoError(t, err)
	must.SliceNotEmpty(t, allocs)
	alloc, _, err := stack.Nomad.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	must.Eq(t, "${NOMAD_TASK_DIR}/oasis/oasis-sim", alloc.Job.TaskGroups[0].Tasks[0].Config["binary"])
	must.True(t, runsFrom(t, "/"+alloc.ID+"/sim/local/oasis/oasis-sim"),
		must.Sprint("no process runs the fetched oasis-sim"))
}

// runsFrom reports whether a process on the machine was started from an executable whose path
// ends with suffix.
func runsFrom(t *testing.T, suffix string) bool {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	must.NoError(t, err)
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if argv0, _, ok := strings.Cut(string(b), "\x00"); err == nil && ok && strings.HasSuffix(argv0, suffix) {
			return true
		}
	}
	return false
}

// TestKvcachedJobFromArtifact runs jobs/kvcached.nomad.hcl with artifact_url and
// artifact_checksum: kvcached passes its Consul checks, started from the fetched copy.
func TestKvcachedJobFromArtifact(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	url, checksum := distCmd(t, root, "oasis-kvcached")
	ports, err := testutil.FreePorts(3)
	must.NoError(t, err)
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), "oasis-kvcached") })
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "kvcached.nomad.hcl"), map[string]string{
		"resp_port": strconv.Itoa(ports[0]), "http_port": strconv.Itoa(ports[1]), "quic_port": strconv.Itoa(ports[2]),
		"data_dir": t.TempDir(), "ram_bytes": "64MiB", "disk_bytes": "128MiB", "memory_mb": "256",
		"consul_addr": stack.ConsulAddr, "artifact_url": url, "artifact_checksum": checksum,
		"auth_enabled": "false"})) // the binary's origin is under test; test/e2e/tiers covers the password
	allocs, _, err := stack.Nomad.Jobs().Allocations("oasis-kvcached", false, nil)
	must.NoError(t, err)
	must.SliceNotEmpty(t, allocs)
	must.True(t, runsFrom(t, "/"+allocs[0].ID+"/kvcached/local/oasis/oasis-kvcached"),
		must.Sprint("no process runs the fetched oasis-kvcached"))
}

// artifactFailed is nil once a task of the job has a "Failed Artifact Download" event whose message is
// go-getter's checksum mismatch, and the task never started.
func artifactFailed(t *testing.T, jobID string) error {
	allocs, _, err := stack.Nomad.Jobs().Allocations(jobID, false, nil)
	if err != nil {
		return err
	}
	var seen []string
	for _, a := range allocs {
		for _, st := range a.TaskStates {
			for _, e := range st.Events {
				if e.Type == nomadapi.TaskArtifactDownloadFailed && strings.Contains(e.DisplayMessage, "Checksums did not match") {
					must.True(t, st.StartedAt.IsZero(), must.Sprint("the task ran"))
					return nil
				}
				seen = append(seen, e.Type+": "+e.DisplayMessage)
			}
		}
	}
	return fmt.Errorf("no failed artifact download with a checksum mismatch in %d allocations; events: %q", len(allocs), seen)
}
