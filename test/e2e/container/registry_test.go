package container

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

const registryUser, registryPassword = "oasis", "e2e-s3cret"

// startRegistry runs Debian's docker-registry (distribution 2.8) with
// htpasswd authentication on registryAddr until the test ends.
func startRegistry(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	hash, err := exec.Command("python3", "-W", "ignore", "-c",
		"import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))", registryPassword).Output()
	must.NoError(t, err, must.Sprint("bcrypt for htpasswd"))
	must.NoError(t, os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(registryUser+":"+strings.TrimSpace(string(hash))+"\n"), 0o600))
	conf := fmt.Sprintf(`version: 0.1
storage:
  filesystem:
    rootdirectory: %s/data
http:
  addr: %s
auth:
  htpasswd:
    realm: oasis
    path: %s/htpasswd
`, dir, registryAddr, dir)
	must.NoError(t, os.WriteFile(filepath.Join(dir, "config.yml"), []byte(conf), 0o600))
	log, err := os.Create(filepath.Join(dir, "registry.log"))
	must.NoError(t, err)
	cmd := exec.Command("docker-registry", "serve", filepath.Join(dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = log, log
	must.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		resp, err := http.Get("http://" + registryAddr + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)), must.Func(func() string {
		b, _ := os.ReadFile(log.Name())
		return "registry not answering: " + string(b)
	}))
}

func podman(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("podman", append([]string{"--url", "unix://" + podmanSocket}, args...)...).CombinedOutput()
	must.NoError(t, err, must.Sprint("podman ", args, ": ", string(out)))
}

// TestPrivateRegistry_PullsWithCredentialsFromVariable: an image only in a
// private registry is pulled with the credentials a template renders from a
// Nomad variable (pull progress as task events), and the engine serves;
// without credentials the pull fails with a clear event.
func TestPrivateRegistry_PullsWithCredentialsFromVariable(t *testing.T) {
	buildSimImage(t)
	startRegistry(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	private := registryAddr + "/oasis/sim:e2e"
	podman(t, "tag", simImage, private)
	podman(t, "push", "--tls-verify=false", "--creds", registryUser+":"+registryPassword, private)
	podman(t, "rmi", private) // only the registry has it under this name now
	t.Cleanup(func() {
		// The driver's pull tagged it again; the next run's registry port differs.
		_ = exec.Command("podman", "--url", "unix://"+podmanSocket, "rmi", private).Run()
	})

	// Without credentials the registry refuses the pull.
	const anonID = "oasis-container-anon"
	_, err := stack.RunJobHCL(ctx, testbed.SimEngine{ID: anonID, Config: fmt.Sprintf("image = %q", private)}.HCL())
	must.NoError(t, err)
	defer func() { _ = stack.StopJob(context.Background(), anonID) }()
	anonAlloc := firstAlloc(t, anonID)
	ev := waitEvent(t, anonAlloc, "Image "+private+" is not available")
	must.StrContains(t, strings.ToLower(ev.DisplayMessage+ev.DriverMessage), "unauthorized")

	const jobID = "oasis-container-private"
	_, _, err = stack.Nomad.Variables().Create(&nomadapi.Variable{Path: "nomad/jobs/" + jobID,
		Items: nomadapi.VariableItems{"user": registryUser, "password": registryPassword}}, nil)
	must.NoError(t, err)
	_, err = stack.RunJobHCL(ctx, testbed.SimEngine{ID: jobID, Config: fmt.Sprintf(`image = %q
        auth {
          username = "${REGISTRY_USER}"
          password = "${REGISTRY_PASSWORD}"
        }`, private),
		Task: `template {
        data        = <<EOT
{{ with nomadVar "nomad/jobs/` + jobID + `" }}REGISTRY_USER={{ .user }}
REGISTRY_PASSWORD={{ .password }}{{ end }}
EOT
        destination = "secrets/registry.env"
        env         = true
      }`}.HCL())
	must.NoError(t, err)
	defer func() { _ = stack.StopJob(context.Background(), jobID) }()
	alloc := runningAlloc(t, ctx, jobID)
	waitEvent(t, alloc.ID, "Pulling image "+private)
	waitEvent(t, alloc.ID, "Pulled image "+private)
	waitEvent(t, alloc.ID, "Engine ready after")
	for _, e := range alloc.TaskStates["engine"].Events {
		must.StrNotContains(t, e.DisplayMessage+e.DriverMessage, registryPassword)
	}
	streamChat(t, "http://"+allocAddr(t, alloc, "http"))
}

func firstAlloc(t *testing.T, jobID string) string {
	t.Helper()
	var id string
	testutil.EventuallyEvery(t, 60*time.Second, 100*time.Millisecond, "the job's first allocation", func() bool {
		allocs, _, err := stack.Nomad.Jobs().Allocations(jobID, false, nil)
		if err != nil || len(allocs) == 0 {
			return false
		}
		id = allocs[0].ID
		return true
	})
	return id
}
