// Package container tests the llm driver's image tasks (issue #40) on the
// real Nomad test bed: an oasis-sim image built here from the project's own
// binary, run by Podman through its REST API.
package container

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var (
	stack *testbed.Stack
	// podmanSocket is the API socket of the Podman service this package runs.
	podmanSocket string
	// registryAddr is where registry_test.go runs a private registry, which
	// the Podman service treats as insecure (plain HTTP).
	registryAddr string
)

// containersConf is what Podman 4.3 needs on a cgroups v1 host whose
// unified hierarchy holds a controller (hybrid mode, as this test machine):
// crun 1.8 refuses hybrid mode, runc runs it; cgroupfs without systemd; and
// container rlimits no higher than the service's own (Podman's defaults,
// nofile 1048576 and nproc 4194304, fail with "setrlimit: operation not
// permitted" where the service's hard limits are lower).
const containersConf = `[containers]
default_ulimits = ["nofile=%d:%d", "nproc=%d:%d"]

[engine]
runtime        = "runc"
cgroup_manager = "cgroupfs"
`

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if _, err := exec.LookPath("podman"); err != nil {
		fmt.Fprintln(os.Stderr, "container e2e: podman is not installed; `make deps` (scripts/deps.sh) installs it with runc")
		return 1
	}
	if _, err := exec.LookPath("docker-registry"); err != nil {
		fmt.Fprintln(os.Stderr, "container e2e: docker-registry is not installed; `make deps` (scripts/deps.sh) installs it")
		return 1
	}
	if _, err := exec.LookPath("runc"); err != nil {
		fmt.Fprintln(os.Stderr, "container e2e: runc is not installed; `make deps` (scripts/deps.sh) installs it")
		return 1
	}
	dir, err := os.MkdirTemp("", "oasis-podman-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	svc, err := startPodman(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "container e2e: starting podman system service: %v\n", err)
		return 1
	}
	defer svc.stop()
	// The agents stop with the test bed, before Nomad's garbage collection
	// would destroy the last tasks: remove what the driver left.
	defer removeContainers()
	return testbed.Main(m, testbed.Options{
		// Bridge: image tasks join the allocation's network namespace too.
		Bridge:         true,
		LLMPluginExtra: fmt.Sprintf("container {\n      runtime = \"podman\"\n      socket  = \"unix://%s\"\n    }", podmanSocket),
	}, &stack)
}

type podmanService struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startPodman runs `podman system service` on a socket of this test's own.
func startPodman(dir string) (*podmanService, error) {
	var nofile, nproc syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err != nil {
		return nil, err
	}
	if err := syscall.Getrlimit(unix.RLIMIT_NPROC, &nproc); err != nil {
		return nil, err
	}
	// Podman lowers its own nproc limit to 32768 where it cannot raise it.
	np := min(nproc.Max, 32768)
	conf := filepath.Join(dir, "containers.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(containersConf, nofile.Max, nofile.Max, np, np)), 0o644); err != nil {
		return nil, err
	}
	// The test's private registry (registry_test.go) serves plain HTTP.
	ports, err := testutil.FreePorts(1)
	if err != nil {
		return nil, err
	}
	registryAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	regConf := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(regConf, []byte(fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", registryAddr)), 0o644); err != nil {
		return nil, err
	}
	podmanSocket = filepath.Join(dir, "podman.sock")
	log, err := os.Create(filepath.Join(dir, "podman.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("podman", "system", "service", "--time=0", "unix://"+podmanSocket)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf, "CONTAINERS_REGISTRIES_CONF="+regConf)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &podmanService{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	// The socket answers, the service exits, or 30 s pass: whichever comes first.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := newAPI().version(); err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			b, _ := os.ReadFile(log.Name())
			return nil, fmt.Errorf("podman system service exited: %s", strings.TrimSpace(string(b)))
		case <-ctx.Done():
			s.stop()
			return nil, fmt.Errorf("socket %s not answering after 30 s", podmanSocket)
		case <-tick.C:
		}
	}
}

func (s *podmanService) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

// removeContainers force-removes every container the llm driver created
// through this package's Podman service (label io.oasis.alloc_id).
func removeContainers() {
	a := newAPI()
	var list []struct {
		ID string `json:"Id"`
	}
	filters := `{"label":["io.oasis.alloc_id"]}`
	if _, err := a.get("/libpod/containers/json", url.Values{"all": {"true"}, "filters": {filters}}, &list); err != nil {
		fmt.Fprintf(os.Stderr, "container e2e: listing containers: %v\n", err)
		return
	}
	for _, c := range list {
		req, _ := http.NewRequest(http.MethodDelete, "http://podman/v4.0.0/libpod/containers/"+c.ID+"?force=true", nil)
		if resp, err := a.c.Do(req); err == nil {
			resp.Body.Close()
		}
	}
}
