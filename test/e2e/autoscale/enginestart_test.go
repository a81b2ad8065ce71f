package autoscale

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tinymodel"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// The engine's share of a cold start (recipes/tiny/sim/agg-zero/README.md): from the engine's
// process start to the first token of a streamed chat sent to it as soon as it accepts one, for
// oasis-sim and for the real llama-server with the tiny model, each started directly (no Nomad),
// several times.

const engineStarts = 5

func TestEngineStartToFirstToken(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	type engine struct {
		name, model string
		bin         string
		args        func(port int) []string
	}
	sim := simBinary(t)
	engines := []engine{{name: "oasis-sim --speed 1", model: "tiny-sim", bin: sim, args: func(port int) []string {
		return []string{"serve", "tiny-sim", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--speed", "1", "--log-level", "warn"}
	}}}
	if llama, model, err := llamaServer(t, root); err != nil {
		t.Logf("llama-server not measured: %v", err)
	} else {
		// The tiny llama.cpp recipe's flags (recipes/tiny/llama-cpp/cpu).
		engines = append(engines, engine{name: "llama-server (tiny model)", model: "tiny-llama", bin: llama, args: func(port int) []string {
			return []string{"-m", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "-a", "tiny-llama",
				"-c", "4096", "--metrics", "-np", "2", "-t", "1", "-tb", "1"}
		}})
	}
	for _, e := range engines {
		var ds []time.Duration
		for range engineStarts {
			ds = append(ds, startToFirstToken(t, e.bin, e.args(testutil.FreePort(t)), e.model))
		}
		slices.Sort(ds)
		t.Logf("%s: process start to first token: median %s, min %s, max %s over %d starts",
			e.name, ds[len(ds)/2].Round(time.Millisecond), ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds))
	}
}

// startToFirstToken starts the engine, sends it a streamed chat until one streams a token (each
// try is refused or answered 503 while it loads), and stops it.
func startToFirstToken(t *testing.T, bin string, args []string, model string) time.Duration {
	t.Helper()
	port := args[slices.Index(args, "--port")+1]
	router := "http://" + net.JoinHostPort("127.0.0.1", port)
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	must.NoError(t, cmd.Start())
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	var first time.Duration
	testutil.EventuallyEvery(t, time.Minute, 5*time.Millisecond, bin+" streaming a first token", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r := chatTo(ctx, router, model, start)
		first = r.ttft
		return r.err == nil
	})
	return first
}

// chatTo is one streamed chat of a few tokens; ttft is from since.
func chatTo(ctx context.Context, base, model string, since time.Time) result {
	r := streamChat(ctx, base, model, "Hello after a cold start", 4)
	if r.err == nil {
		r.ttft += r.start.Sub(since)
	}
	return r
}

// simBinary is oasis-sim: OASIS_TESTBED_PREBUILT's, else built for the test.
func simBinary(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("OASIS_TESTBED_PREBUILT"); dir != "" {
		if p := filepath.Join(dir, "oasis-sim"); fileExists(p) {
			return p
		}
	}
	return testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
}

// llamaServer is bin/llama-server and the tiny model made from bin/llama.cpp's vocabulary.
func llamaServer(t *testing.T, root string) (bin, model string, err error) {
	t.Helper()
	if bin, err = filepath.EvalSymlinks(filepath.Join(root, "bin", "llama-server")); err != nil {
		return "", "", err
	}
	src, err := filepath.EvalSymlinks(filepath.Join(root, "bin", "llama.cpp"))
	if err != nil {
		return "", "", err
	}
	model = filepath.Join(t.TempDir(), "tiny.gguf")
	if err := tinymodel.WriteFile(model, src, tinymodel.Options{Seed: 1}); err != nil {
		return "", "", fmt.Errorf("making the tiny model: %w", err)
	}
	return bin, model, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
