package openaisdk

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tinymodel"
)

// llamaModel is the name the llama-server engines serve (-a).
const llamaModel = "tiny"

// llamaSkips are the checks that do not apply to llama-server, and why.
var llamaSkips = map[string]string{
	"responses create, retrieve, previous_response_id, cancel": "llama-server's /v1/responses is stateless: " +
		"no stored response to retrieve, continue (previous_response_id) or cancel",
	"adapter loaded on demand": "llama-server loads no adapter at run time: it applies those it started with " +
		"(--lora) by id, which the adapter-by-name check covers",
}

// startLlamaServer runs bin/llama-server (scripts/hashistack.sh llama-server
// builds it) on model as the driver renders it (-a, -c, --metrics), with
// more flags, and returns its address once /health answers 200.
func startLlamaServer(t *testing.T, bin, model string, more ...string) *testutil.Sim {
	t.Helper()
	port := testutil.FreePort(t)
	cmd := exec.Command(bin, append([]string{"-m", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "-a", llamaModel,
		"-c", "4096", "-np", "2", "-t", "1", "-tb", "1", "--metrics"}, more...)...)
	p := testutil.Start(t, cmd)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	testutil.Eventually(t, 60*time.Second, "llama-server to answer /health", func() bool {
		if p.Exited() {
			t.Fatalf("llama-server exited:\n%s", p.Output())
		}
		_, err := get("http://" + addr + "/health")
		return err == nil
	})
	return &testutil.Sim{Addr: addr, Process: p}
}

// llamaBins returns bin/llama-server and the llama.cpp source its model's
// vocabulary comes from, skipping the test without them.
func llamaBins(t *testing.T) (bin, src string) {
	t.Helper()
	bin, err := filepath.Abs("../../../bin/llama-server")
	must.NoError(t, err)
	src, err = filepath.EvalSymlinks("../../../bin/llama.cpp")
	if _, serr := os.Stat(bin); serr != nil || err != nil {
		testutil.SkipUnlessCI(t, "no bin/llama-server and bin/llama.cpp (scripts/hashistack.sh llama-server builds them)")
	}
	return bin, src
}

// TestOpenAINodeSDKLlamaServer runs the SDK's checks against the router on
// two real llama-server engines serving the tiny model and a LoRA adapter
// of it (internal/tinymodel); llamaSkips says which do not apply.
func TestOpenAINodeSDKLlamaServer(t *testing.T) {
	bin, src := llamaBins(t)
	mods := installSDK(t)
	routerBin = testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-router")
	dir := t.TempDir()
	model, lora := filepath.Join(dir, "tiny.gguf"), filepath.Join(dir, "sql.gguf")
	must.NoError(t, tinymodel.WriteFile(model, src, tinymodel.Options{Seed: 1}))
	must.NoError(t, tinymodel.WriteLoRAFile(lora, tinymodel.Options{Seed: 8}, 4))
	cc, consulAddr := testutil.StartConsul(t)
	a, b := startLlamaServer(t, bin, model, "--lora", lora), startLlamaServer(t, bin, model, "--lora", lora)
	for id, e := range map[string]*testutil.Sim{"llama-a": a, "llama-b": b} {
		register(t, cc, id, e, map[string]string{"oasis_model": llamaModel, "oasis_engine": "llama_cpp",
			"oasis_lora_loadable": adapter + "=" + lora})
	}
	url := startRouter(t, consulAddr, adapter, llamaModel)
	runSDK(t, mods, llamaSkips, "OASIS_ROUTER_URL="+url, "OASIS_MODEL="+llamaModel, "OASIS_ADAPTER="+adapter,
		"OASIS_ADAPTER_ANSWER_MODEL="+llamaModel,
		"OASIS_ENGINES="+a.Addr+","+b.Addr,
		"OASIS_BAD_MAX_TOKENS=-5", "OASIS_RUNNING_METRIC=llamacpp:requests_processing ", "OASIS_RESPONSES_STATELESS=1")
}

// completionText posts a greedy completion to url and returns its text.
func completionText(t *testing.T, url, body string) string {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	must.NoError(t, err)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprintf("%s", b))
	var v struct{ Choices []struct{ Text string } }
	must.NoError(t, json.Unmarshal(b, &v), must.Sprintf("%s", b))
	must.Len(t, 1, v.Choices)
	return v.Choices[0].Text
}

// TestLlamaServerAdapterByName: a LoRA adapter a real llama-server loaded at
// start (--lora) is routable by the name oasis_lora_loadable gives its path:
// the router's answer for the adapter is the engine's with that adapter
// applied by id, and for the base model the engine's without any adapter.
func TestLlamaServerAdapterByName(t *testing.T) {
	bin, src := llamaBins(t)
	routerBin = testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-router")
	dir := t.TempDir()
	model, chat, sql := filepath.Join(dir, "tiny.gguf"), filepath.Join(dir, "chat.gguf"), filepath.Join(dir, "sql.gguf")
	must.NoError(t, tinymodel.WriteFile(model, src, tinymodel.Options{Seed: 1}))
	must.NoError(t, tinymodel.WriteLoRAFile(chat, tinymodel.Options{Seed: 7}, 4))
	must.NoError(t, tinymodel.WriteLoRAFile(sql, tinymodel.Options{Seed: 8}, 4))
	cc, consulAddr := testutil.StartConsul(t)
	e := startLlamaServer(t, bin, model, "--lora", chat+","+sql)
	register(t, cc, "llama-a", e, map[string]string{"oasis_model": llamaModel, "oasis_engine": "llama_cpp",
		"oasis_lora_loadable": "sql=" + sql})
	url := startRouter(t, consulAddr, "sql", llamaModel)

	const prompt = `"prompt":"once upon a time","max_tokens":8,"temperature":0,"cache_prompt":false`
	direct := "http://" + e.Addr
	withSQL := completionText(t, direct, `{"model":"tiny",`+prompt+`,"lora":[{"id":1,"scale":1}]}`)
	base := completionText(t, direct, `{"model":"tiny",`+prompt+`,"lora":[{"id":0,"scale":0}]}`)
	must.NotEq(t, base, withSQL, must.Sprint("the adapter changes the text"))
	// An empty list is not the base model: llama-server then applies every
	// adapter at its global scale (1 from --lora), which the router must not send.
	global := completionText(t, direct, `{"model":"tiny",`+prompt+`,"lora":[]}`)
	must.NotEq(t, base, global, must.Sprint(`"lora": [] applies the adapters`))

	must.Eq(t, withSQL, completionText(t, url, `{"model":"sql",`+prompt+`}`))
	must.Eq(t, base, completionText(t, url, `{"model":"tiny",`+prompt+`}`))
}
