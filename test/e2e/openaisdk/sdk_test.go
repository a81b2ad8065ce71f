// Package openaisdk runs the official OpenAI Node SDK (npm openai) against
// oasis-router on oasis-sim engines, and on real llama-server engines,
// found in a real Consul: every client feature an application uses (issue
// #36) is one subtest.
package openaisdk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// SDKVersion is the openai npm package the test installs (once, into the
// cache shared with scripts/hashistack.sh's tools).
const SDKVersion = "7.59.0"

const (
	model     = "m"
	adapter   = "sql-lora"
	loadable  = "dyn-lora"   // sim b loads it when the router first sends it a request naming it
	downModel = "down-model" // named by the policy, served by no engine: 503
	origin    = "http://app.example"
)

var simBin, routerBin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithCommand(m, "github.com/oasis-llm/oasis/cmd/oasis-sim", &simBin))
}

// cacheDir is scripts/hashistack.sh's cache: OASIS_CACHE_DIR, else
// $XDG_CACHE_HOME/oasis, else ~/.cache/oasis.
func cacheDir() (string, error) {
	if d := os.Getenv("OASIS_CACHE_DIR"); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "oasis"), nil
	}
	home, err := os.UserHomeDir()
	return filepath.Join(home, ".cache", "oasis"), err
}

// installSDK returns the node_modules directory holding openai@SDKVersion,
// installing it with npm the first time.
func installSDK(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		testutil.SkipUnlessCI(t, "no node on PATH: the OpenAI Node SDK test needs Node.js 20+")
	}
	cache, err := cacheDir()
	must.NoError(t, err)
	dir := filepath.Join(cache, "npm-openai-"+SDKVersion)
	mods := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(mods, "openai", "package.json")); err == nil {
		return mods
	}
	if _, err := exec.LookPath("npm"); err != nil {
		testutil.SkipUnlessCI(t, "no npm on PATH to install the OpenAI Node SDK")
	}
	must.NoError(t, os.MkdirAll(cache, 0o755))
	tmp, err := os.MkdirTemp(cache, "npm-openai-")
	must.NoError(t, err)
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "npm", "install", "--prefix", tmp, "--no-audit", "--no-fund",
		"--ignore-scripts", "openai@"+SDKVersion).CombinedOutput()
	must.NoError(t, err, must.Sprintf("npm install openai@%s:\n%s", SDKVersion, out))
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, os.ErrExist) {
		// Another run installed it meanwhile: use that one.
		if _, serr := os.Stat(filepath.Join(mods, "openai", "package.json")); serr != nil {
			t.Fatalf("installing the SDK into %s: %v", dir, err)
		}
	}
	return mods
}

// register adds an engine instance to Consul's catalog (no checks: passing).
func register(t *testing.T, c *consulapi.Client, id string, sim *testutil.Sim, meta map[string]string) {
	t.Helper()
	host, ps, err := net.SplitHostPort(sim.Addr)
	must.NoError(t, err)
	port, err := strconv.Atoi(ps)
	must.NoError(t, err)
	for k, v := range map[string]string{"oasis_model": model, "oasis_engine": "sim", "oasis_block_size": "16"} {
		if meta[k] == "" {
			meta[k] = v
		}
	}
	must.NoError(t, c.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: id, Name: "oasis-engine", Address: host, Port: port, Meta: meta}))
}

// get returns the body of a 200 answer to GET url.
func get(url string) ([]byte, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

// startRouter runs oasis-router over Consul with a round-robin policy (so
// that Responses API affinity, not luck, brings ids back to their engine),
// CORS for origin, and returns its base URL once /v1/models/{ready} answers
// a card with parent (adapter) or, without one, any card.
func startRouter(t *testing.T, consulAddr, ready, parent string) string {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.json")
	must.NoError(t, os.WriteFile(pol, []byte(`{"policy":"round_robin","models":{"`+downModel+`":{}}}`), 0o600))
	key := filepath.Join(dir, "response-id-key")
	must.NoError(t, os.WriteFile(key, bytes.Repeat([]byte("k"), 32), 0o600))
	addr := testutil.FreeAddr(t)
	cmd := exec.Command(routerBin, "-listen", addr, "-consul-addr", consulAddr, "-policy-file", pol,
		"-response-id-key-file", key, "-cors-origins", origin)
	cmd.Env = append(os.Environ(), "CONSUL_HTTP_TOKEN=")
	p := testutil.Start(t, cmd)
	url := "http://" + addr
	testutil.Eventually(t, 20*time.Second, "the router to route "+ready, func() bool {
		if p.Exited() {
			t.Fatalf("oasis-router exited:\n%s", p.Output())
		}
		b, err := get(url + "/v1/models/" + ready)
		return err == nil && (parent == "" || bytes.Contains(b, []byte(`"parent":"`+parent+`"`)))
	})
	return url
}

type result struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
	Skipped bool   `json:"skipped"`
}

// checks is how many checks sdk.cjs reports.
const checks = 17

func TestOpenAINodeSDK(t *testing.T) {
	mods := installSDK(t)
	routerBin = testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-router")
	cc, consulAddr := testutil.StartConsul(t)
	a := testutil.StartSim(t, testutil.SimConfig{Bin: simBin, Model: model, Args: []string{"--block-size", "16",
		"--enable-lora", "--lora-modules", adapter + "=/adapters/sql"}})
	b := testutil.StartSim(t, testutil.SimConfig{Bin: simBin, Model: model, Args: []string{"--block-size", "16", "--enable-lora"},
		Env: []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=true"}})
	register(t, cc, "sim-a", a, map[string]string{"oasis_lora_adapters": adapter})
	register(t, cc, "sim-b", b, map[string]string{"oasis_lora_loadable": loadable + "=/adapters/dyn"})
	url := startRouter(t, consulAddr, adapter, model)
	runSDK(t, mods, nil, "OASIS_ROUTER_URL="+url, "OASIS_MODEL="+model, "OASIS_ADAPTER="+adapter,
		"OASIS_LOADABLE="+loadable, "OASIS_ENGINES="+a.Addr+","+b.Addr)
}

// runSDK runs sdk.cjs with env (and the down model, the CORS origin) and
// makes each check a subtest; skip names the checks that do not apply, with
// the reason.
func runSDK(t *testing.T, mods string, skip map[string]string, env ...string) {
	t.Helper()
	names := []string{}
	for n := range skip {
		names = append(names, n)
	}
	skipJSON, err := json.Marshal(names)
	must.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := exec.CommandContext(ctx, "node", "sdk.cjs")
	node.Env = append(append(os.Environ(), "NODE_PATH="+mods, "OASIS_DOWN_MODEL="+downModel, "OASIS_CORS_ORIGIN="+origin,
		"OASIS_SKIP="+string(skipJSON)), env...)
	var stderr bytes.Buffer
	node.Stderr = &stderr
	out, err := node.Output()
	t.Logf("node: %v\n%s", err, stderr.String())

	var results []result
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r result
		must.NoError(t, json.Unmarshal(sc.Bytes(), &r), must.Sprintf("node printed %q", sc.Text()))
		results = append(results, r)
	}
	must.Eq(t, checks, len(results), must.Sprintf("every check reported (node: %v)", err))
	for _, r := range results {
		t.Run(r.Name, func(t *testing.T) {
			switch {
			case r.Skipped:
				t.Skip(skip[r.Name])
			case !r.OK:
				t.Fatal(r.Detail)
			case r.Detail != "":
				t.Log(r.Detail)
			}
		})
	}
}
