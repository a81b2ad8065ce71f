package openaisdk

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	"adapter by name": "llama-server applies LoRA adapters by id (a request's lora field, POST /lora-adapters), " +
		"not as served model names",
	"adapter loaded on demand": "the router loads adapters with vLLM's /v1/load_lora_adapter; " +
		"llama-server loads its adapters at start (--lora) and only scales them at run time",
}

// startLlamaServer runs bin/llama-server (scripts/hashistack.sh llama-server
// builds it) on model as the driver renders it (-a, -c, --metrics) and
// returns its address once /health answers 200.
func startLlamaServer(t *testing.T, bin, model string) *testutil.Sim {
	t.Helper()
	port := testutil.FreePort(t)
	cmd := exec.Command(bin, "-m", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "-a", llamaModel,
		"-c", "4096", "-np", "2", "-t", "1", "-tb", "1", "--metrics")
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

// TestOpenAINodeSDKLlamaServer runs the SDK's checks against the router on
// two real llama-server engines serving the tiny model (internal/tinymodel);
// llamaSkips says which do not apply.
func TestOpenAINodeSDKLlamaServer(t *testing.T) {
	bin, err := filepath.Abs("../../../bin/llama-server")
	must.NoError(t, err)
	src, err := filepath.EvalSymlinks("../../../bin/llama.cpp")
	if _, serr := os.Stat(bin); serr != nil || err != nil {
		testutil.SkipUnlessCI(t, "no bin/llama-server and bin/llama.cpp (scripts/hashistack.sh llama-server builds them)")
	}
	mods := installSDK(t)
	routerBin = testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-router")
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	must.NoError(t, tinymodel.WriteFile(model, src, tinymodel.Options{Seed: 1}))
	cc, consulAddr := testutil.StartConsul(t)
	a, b := startLlamaServer(t, bin, model), startLlamaServer(t, bin, model)
	for id, e := range map[string]*testutil.Sim{"llama-a": a, "llama-b": b} {
		register(t, cc, id, e, map[string]string{"oasis_model": llamaModel, "oasis_engine": "llama_cpp"})
	}
	url := startRouter(t, consulAddr, llamaModel, "")
	runSDK(t, mods, llamaSkips, "OASIS_ROUTER_URL="+url, "OASIS_MODEL="+llamaModel, "OASIS_ENGINES="+a.Addr+","+b.Addr,
		"OASIS_BAD_MAX_TOKENS=-5", "OASIS_RUNNING_METRIC=llamacpp:requests_processing ", "OASIS_RESPONSES_STATELESS=1")
}
