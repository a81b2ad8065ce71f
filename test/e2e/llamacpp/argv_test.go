package llamacpp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tinymodel"
	"github.com/oasis-llm/oasis/router/enginestats"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// renderedArgvs reads the argv of every llama.cpp golden of the driver's renderer
// (nomad-driver/render/testdata: the matrix and the named cases) that renders a process;
// the renderer's unit tests keep the goldens equal to what it renders.
func renderedArgvs(t *testing.T) map[string][]string {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "nomad-driver/render/testdata/*/llama_cpp-*.golden"))
	must.NoError(t, err)
	out := map[string][]string{}
	for _, f := range files {
		fh, err := os.Open(f)
		must.NoError(t, err)
		var argv []string
		in := false
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "argv:":
				in = true
			case in && strings.HasPrefix(line, "  "):
				argv = append(argv, strings.TrimPrefix(line, "  "))
			default:
				in = false
			}
		}
		fh.Close()
		if len(argv) > 0 {
			out[filepath.Base(filepath.Dir(f))+"/"+strings.TrimSuffix(filepath.Base(f), ".golden")] = argv
		}
	}
	must.Positive(t, len(out), must.Sprint("no llama.cpp golden renders a process"))
	return out
}

// localize points a rendered argv at this machine: the tiny model, loopback, a free port,
// and each --lora at a LoRA adapter of the tiny model written for the test.
func localize(t *testing.T, argv []string) ([]string, string) {
	t.Helper()
	out := append([]string(nil), argv...)
	port := testutil.FreePort(t)
	host := "127.0.0.1"
	for i := 1; i < len(out)-1; i++ {
		switch out[i] {
		case "-m":
			out[i+1] = modelPath
		case "--host":
			if out[i+1] != "0.0.0.0" {
				out[i+1] = host
			}
		case "--port":
			out[i+1] = strconv.Itoa(port)
		case "--lora":
			path := filepath.Join(t.TempDir(), fmt.Sprintf("lora-%d.gguf", i))
			must.NoError(t, tinymodel.WriteLoRAFile(path, tinymodel.Options{Seed: uint64(i)}, 4))
			out[i+1] = path
		}
	}
	return out, hostPort(host, port)
}

// Every llama.cpp argv the driver renders is accepted by the real llama-server: it
// loads the model, reports loading as 503 on /health and then 200, serves the alias
// given with -a, exports llamacpp:* metrics the router's engine stats read (--metrics),
// and exits 0 on SIGTERM.
func TestRenderedArgvAccepted(t *testing.T) {
	for name, argv := range renderedArgvs(t) {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			args, addr := localize(t, argv)
			t.Logf("argv: %s", strings.Join(args, " "))
			start := time.Now()
			e := startDirect(t, args, addr)
			seen := waitHealthy(t, e, 60*time.Second)
			t.Logf("healthy after %s; /health answers on the way: %v", time.Since(start).Round(time.Millisecond), seen)
			for _, h := range seen[:len(seen)-1] {
				must.Eq(t, http.StatusServiceUnavailable, h.code, must.Sprintf("before ready: %+v", h))
				must.StrContains(t, h.body, "Loading model")
			}

			var models struct {
				Data []struct {
					ID string `json:"id"`
				} `json:"data"`
			}
			code, b, err := get("http://" + addr + "/v1/models")
			must.NoError(t, err)
			must.Eq(t, http.StatusOK, code)
			must.NoError(t, json.Unmarshal(b, &models))
			must.SliceNotEmpty(t, models.Data)
			must.Eq(t, argAfter(argv, "-a"), models.Data[0].ID)

			if want := argAfter(argv, "-c"); want != "" {
				n, _ := strconv.Atoi(want)
				for _, s := range slots(t, addr) {
					must.Positive(t, s.NCtx)
					must.LessEq(t, n, s.NCtx)
				}
			}

			if loras := argsAfter(args, "--lora"); len(loras) > 0 {
				checkLoRAAdapters(t, addr, loras)
			}

			code, b = post(t, "http://"+addr+"/v1/completions", `{"prompt":"The rendered argv works","max_tokens":3}`, nil)
			must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
			resp, err := http.Get("http://" + addr + "/metrics")
			must.NoError(t, err)
			m, err := enginestats.ParseEngineMetrics(resp.Body, nil)
			resp.Body.Close()
			must.NoError(t, err)
			must.True(t, m.HasLoad, must.Sprint("no llamacpp:requests_processing / requests_deferred"))
			must.True(t, m.HasGenTokens)
			must.Eq(t, 3.0, m.GenTokens)

			must.NoError(t, e.cmd.Process.Signal(syscall.SIGTERM))
			select {
			case <-e.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("llama-server did not exit within 30 s of SIGTERM:\n%s", e.logText())
			}
			must.Eq(t, 0, e.cmd.ProcessState.ExitCode(), must.Sprintf("%s", e.logText()))
		})
	}
}

// checkLoRAAdapters: GET /lora-adapters lists the adapters in --lora order (ids 0, 1, ...),
// each with its path as given, which is how the router finds an adapter's id.
func checkLoRAAdapters(t *testing.T, addr string, paths []string) {
	t.Helper()
	code, b, err := get("http://" + addr + "/lora-adapters")
	must.NoError(t, err)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	var adapters []struct {
		ID   int    `json:"id"`
		Path string `json:"path"`
	}
	must.NoError(t, json.Unmarshal(b, &adapters), must.Sprintf("%s", b))
	must.Len(t, len(paths), adapters, must.Sprintf("%s", b))
	for i, a := range adapters {
		must.Eq(t, i, a.ID)
		must.Eq(t, paths[i], a.Path)
	}
}

// argsAfter returns the value of every occurrence of flag.
func argsAfter(argv []string, flag string) []string {
	var out []string
	for i := 0; i < len(argv)-1; i++ {
		if argv[i] == flag {
			out = append(out, argv[i+1])
		}
	}
	return out
}

func argAfter(argv []string, flag string) string {
	for i := 0; i < len(argv)-1; i++ {
		if argv[i] == flag {
			return argv[i+1]
		}
	}
	return ""
}

// The model's size, load time and speed on one core, as llama-server reports them
// (timings of one completion; -t 1 -tb 1).
func TestTinyModelOnOneCore(t *testing.T) {
	st, err := os.Stat(modelPath)
	must.NoError(t, err)
	port := testutil.FreePort(t)
	addr := hostPort("127.0.0.1", port)
	start := time.Now()
	e := startDirect(t, []string{"llama-server", "-m", modelPath, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-t", "1", "-tb", "1", "-np", "1", "-c", "4096"}, addr)
	waitHealthy(t, e, 60*time.Second)
	load := time.Since(start)

	var out struct {
		Timings struct {
			PromptN         int     `json:"prompt_n"`
			PromptPerSecond float64 `json:"prompt_per_second"`
			PredictedN      int     `json:"predicted_n"`
			PredictedPerSec float64 `json:"predicted_per_second"`
		} `json:"timings"`
	}
	prompt := strings.Repeat("Measure the tiny model on one core. ", 30)
	code, b := post(t, "http://"+addr+"/completion", `{"prompt":`+strconv.Quote(prompt)+`,"n_predict":64,"ignore_eos":true,"cache_prompt":false}`, &out)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	must.Eq(t, 64, out.Timings.PredictedN)
	must.Positive(t, out.Timings.PredictedPerSec)
	t.Logf("model %.1f MB, healthy %s after start; one core: prompt %d tokens at %.0f tokens/s, %d generated at %.0f tokens/s",
		float64(st.Size())/1e6, load.Round(time.Millisecond), out.Timings.PromptN, out.Timings.PromptPerSecond,
		out.Timings.PredictedN, out.Timings.PredictedPerSec)
}
