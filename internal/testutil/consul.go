package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// ConsulBinary finds a real consul: $OASIS_CONSUL_BIN, the repository's
// bin/consul (make hashistack), or PATH; "" when there is none.
func ConsulBinary() string {
	if p := os.Getenv("OASIS_CONSUL_BIN"); p != "" {
		return p
	}
	if dir, err := os.Getwd(); err == nil {
		for {
			p := filepath.Join(dir, "bin", "consul")
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				if _, err := os.Stat(p); err == nil {
					return p
				}
				break // the module's root, without bin/consul
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	p, _ := exec.LookPath("consul")
	return p
}

// SkipUnlessCI skips the test, or fails it under CI (CI set), where every
// test must run.
func SkipUnlessCI(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// StartConsul runs a Consul dev agent on free loopback ports (no DNS or
// gRPC) for the duration of the test, waits for its leader, and returns a
// client and its HTTP address. Without a consul binary the test is skipped
// (failed under CI).
func StartConsul(t testing.TB) (*consulapi.Client, string) {
	t.Helper()
	bin := ConsulBinary()
	if bin == "" {
		SkipUnlessCI(t, "no consul binary: set OASIS_CONSUL_BIN or run make hashistack (bin/consul)")
	}
	httpPort := FreePort(t)
	port := func() string { return strconv.Itoa(FreePort(t)) }
	Start(t, exec.Command(bin, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-http-port", strconv.Itoa(httpPort), "-dns-port", "-1", "-serf-lan-port", port(), "-serf-wan-port", port(),
		"-server-port", port(), "-grpc-port", "-1", "-grpc-tls-port", "-1", "-data-dir", t.TempDir(), "-log-level", "warn"))
	cfg := consulapi.DefaultConfig()
	cfg.Address = "127.0.0.1:" + strconv.Itoa(httpPort)
	client, err := consulapi.NewClient(cfg)
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		leader, err := client.Status().Leader()
		return err == nil && leader != ""
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)))
	return client, cfg.Address
}
