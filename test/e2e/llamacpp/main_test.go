// Package llamacpp runs a real inference engine through Oasis: llama.cpp's llama-server
// (scripts/hashistack.sh llama-server builds it on CPU from the source node-llama-cpp
// ships) serving a tiny random-weight Llama model (internal/tinymodel: Llama 3's real
// vocabulary, Llama 3.1's chat template), launched by the llm driver on the real Nomad +
// Consul test bed and reached through the real router. The model's words are noise;
// tokenization, the chat template, slots, the KV cache, timings, metrics, errors and
// shutdown are llama-server's own.
package llamacpp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/tinymodel"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var (
	stack *testbed.Stack
	// llamaServer is the real binary, copied where every user may run it.
	llamaServer string
	// modelPath is the tiny model, made for this run.
	modelPath string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	root, err := testbed.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "oasis-llamacpp-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := filepath.EvalSymlinks(filepath.Join(root, "bin", "llama-server"))
	if err == nil {
		var src string
		src, err = filepath.EvalSymlinks(filepath.Join(root, "bin", "llama.cpp"))
		if err == nil {
			err = prepare(dir, bin, src)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "llamacpp: %v (`scripts/hashistack.sh llama-server` builds bin/llama-server and bin/llama.cpp; make e2e runs it)\n", err)
		return 1
	}
	return testbed.Main(m, testbed.Options{LLMPluginConfig: fmt.Sprintf("binaries = { llama_cpp = %q }", llamaServer)}, &stack)
}

// prepare copies the binary and makes the model in dir, which every user may read: the
// driver may run the engine as an unprivileged user.
func prepare(dir, bin, src string) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	llamaServer = filepath.Join(dir, "llama-server")
	if err := os.WriteFile(llamaServer, data, 0o755); err != nil {
		return err
	}
	modelPath = filepath.Join(dir, "tiny.gguf")
	start := time.Now()
	if err := tinymodel.WriteFile(modelPath, src, tinymodel.Options{Seed: 1}); err != nil {
		return fmt.Errorf("making the model: %w", err)
	}
	st, err := os.Stat(modelPath)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "llamacpp: model %s (%.1f MB) made in %s\n", modelPath, float64(st.Size())/1e6, time.Since(start).Round(time.Millisecond))
	return nil
}

// engine is a llama-server this test started itself (not through Nomad).
type engine struct {
	addr    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
}

// startDirect runs argv (argv[0] is replaced by the real binary) in its own process
// group, its output in a file of the test's; the cleanup ends the group by its pid.
func startDirect(t *testing.T, argv []string, addr string) *engine {
	t.Helper()
	cmd := exec.Command(llamaServer, argv[1:]...)
	f, err := os.CreateTemp(t.TempDir(), "llama-server-*.log")
	must.NoError(t, err)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must.NoError(t, cmd.Start())
	e := &engine{addr: addr, cmd: cmd, logPath: f.Name(), done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(e.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-e.done
	})
	return e
}

func (e *engine) logText() string {
	b, _ := os.ReadFile(e.logPath)
	return string(b)
}

func (e *engine) exited() bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// get fetches url and returns the status and body.
func get(url string) (int, []byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// post sends a JSON body and decodes a 200's JSON answer into out (when not nil).
func post(t *testing.T, url, body string, out any) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	if out != nil && resp.StatusCode == http.StatusOK {
		must.NoError(t, json.Unmarshal(b, out), must.Sprintf("body: %s", b))
	}
	return resp.StatusCode, b
}

// health is one answer of /health while the engine starts.
type health struct {
	code int
	body string
}

// waitHealthy polls /health every 2 ms until it answers 200 and returns the distinct
// answers seen on the way (connection refused is not an answer); it fails at once if
// the engine exits.
func waitHealthy(t *testing.T, e *engine, timeout time.Duration) []health {
	t.Helper()
	var seen []health
	// must.Func: a failure shows the answers and the log at the deadline.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		if e.exited() {
			t.Fatalf("llama-server exited (%v) before it was healthy:\n%s", e.cmd.ProcessState, e.logText())
		}
		code, b, err := get("http://" + e.addr + "/health")
		if err == nil && (len(seen) == 0 || seen[len(seen)-1].code != code) {
			seen = append(seen, health{code, string(b)})
		}
		return code == http.StatusOK
	}), wait.Timeout(timeout), wait.Gap(2*time.Millisecond)), must.Func(func() string {
		return fmt.Sprintf("llama-server not healthy after %s (answers %v):\n%s", timeout, seen, e.logText())
	}))
	return seen
}

// slot is one entry of llama-server's GET /slots.
type slot struct {
	ID           int  `json:"id"`
	IsProcessing bool `json:"is_processing"`
	NCtx         int  `json:"n_ctx"`
}

func slots(t *testing.T, addr string) []slot {
	t.Helper()
	code, b, err := get("http://" + addr + "/slots")
	must.NoError(t, err)
	must.Eq(t, http.StatusOK, code, must.Sprintf("/slots: %s", b))
	var s []slot
	must.NoError(t, json.Unmarshal(b, &s), must.Sprintf("/slots: %s", b))
	return s
}

// hostPort joins a host and a port.
func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// ctxT is a context that ends after d or with the test.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
