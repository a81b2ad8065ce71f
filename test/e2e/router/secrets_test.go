package router

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// jobSecrets are the secrets the system jobs take, each random so that finding it anywhere is
// a leak and not a coincidence.
type jobSecrets struct {
	tlsKey     []byte // the router's TLS private key (PEM)
	tlsCert    []byte
	hostedKey  string // the hosted API key the router sends upstream
	apiKey     string // a client's API key (only its digest is stored, in Consul KV)
	redisPass  string // kvcached's password
	engineKey  string // an engine's own API key (vLLM --api-key), from its Nomad variable
	caPool     *tlsfilestest.CA
	hostedSeen chan string // Authorization headers the fake hosted API received
}

func newJobSecrets(t *testing.T) *jobSecrets {
	ca := tlsfilestest.NewCA(t, "oasis-secrets-ca")
	leaf := ca.Issue(t, "oasis-router", "127.0.0.1")
	return &jobSecrets{tlsKey: leaf.KeyPEM, tlsCert: leaf.CertPEM, hostedKey: "sk-hosted-" + randomHex(t),
		apiKey: "oasis-key-" + randomHex(t), redisPass: "redis-" + randomHex(t), engineKey: "engine-" + randomHex(t), caPool: ca,
		hostedSeen: make(chan string, 16)}
}

func randomHex(t *testing.T) string {
	b := make([]byte, 16)
	_, err := rand.Read(b)
	must.NoError(t, err)
	return hex.EncodeToString(b)
}

// TestJobSecretsStayOutOfNomadAndConsul runs jobs/router.nomad.hcl, jobs/kvcached.nomad.hcl and
// the hosted recipe on the ACL-enabled test bed with every secret they take: the router's TLS key
// and a hosted API key from its Nomad variable, a client API key whose digest is in Consul KV, and
// kvcached's password from its Nomad variable. Each secret reaches its process (HTTPS with the
// key; a request with the API key answered by the hosted API, which receives the hosted key;
// AUTH with the password) and appears nowhere Nomad or Consul show: the jobs, the allocations as
// `nomad alloc status -json` prints them (task events included), the tasks' logs, and the Consul
// registrations (meta, tags, check output). It also shows the jobs run with the least privilege
// of jobs/acl: the router reads Consul with its role (it serves, and writes the default policy)
// and Nomad node statistics with its workload identity.
func TestJobSecretsStayOutOfNomadAndConsul(t *testing.T) {
	if stack.NomadToken == "" {
		t.Fatal("the test bed runs without ACLs: this test checks the jobs' least privilege")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	sec := newJobSecrets(t)
	hosted := fakeHostedAPI(t, sec.hostedSeen)
	routerURL, kvcachedAddr := runSecretJobs(t, ctx, root, sec, hosted)

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: tlsfilestest.Pool(sec.caPool), MinVersion: tls.VersionTLS12}}}
	t.Cleanup(client.CloseIdleConnections)
	waitRouterServes(t, ctx, client, routerURL, sec.apiKey)
	select {
	case got := <-sec.hostedSeen:
		must.Eq(t, "Bearer "+sec.hostedKey, got)
	case <-time.After(10 * time.Second):
		t.Fatal("the hosted API never received a request")
	}
	checkKvcachedPassword(t, ctx, kvcachedAddr, sec.redisPass)
	checkRouterPrivileges(t, ctx, &routerProc{url: routerURL, client: client})

	haystacks := nomadAndConsulViews(t, ctx, []string{"oasis-router", "oasis-kvcached", hostedJobID, secretEngineJob})
	needles := map[string]string{"TLS key": pemBody(sec.tlsKey), "hosted key": sec.hostedKey,
		"API key": sec.apiKey, "kvcached password": sec.redisPass, "engine key": sec.engineKey}
	// The views are the real ones: the job shows its templates, the router logged.
	must.StrContains(t, haystacks["job oasis-router"], `nomadVar \"nomad/jobs/oasis-router\"`)
	// The llm driver's start event names the flag and hides its value.
	must.StrContains(t, haystacks["allocation of "+secretEngineJob], "--api-key <redacted>")
	must.StrContains(t, haystacks["stderr of task router (oasis-router)"], "wrote default policy document")
	for where, text := range haystacks {
		for what, secret := range needles {
			must.StrNotContains(t, text, secret, must.Sprintf("the %s leaks into %s", what, where))
		}
	}
}

// pemBody is a line of the PEM block's base64 body: distinctive, and what a leak would contain.
func pemBody(p []byte) string {
	lines := strings.Split(strings.TrimSpace(string(p)), "\n")
	return lines[1]
}

// fakeHostedAPI answers chat completions as a hosted OpenAI-compatible API does and reports the
// Authorization header of each (the llm driver's own probes of the endpoint are not reported).
func fakeHostedAPI(t *testing.T, seen chan<- string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[{"id":"hosted-m","object":"model"}]}`)
			return
		}
		select {
		case seen <- r.Header.Get("Authorization"):
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","object":"chat.completion","model":"hosted-m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// hostedJobID is the job id of recipes/hosted/openai-compat/fallback.
const hostedJobID = "hosted-openai-compat-fallback"

// runSecretJobs puts the secrets where the jobs read them and runs the jobs; it returns the
// router's URL and kvcached's RESP address.
func runSecretJobs(t *testing.T, ctx context.Context, root string, sec *jobSecrets, hostedURL string) (string, string) {
	_, _, err := stack.Nomad.Variables().Create(&nomadapi.Variable{Path: "nomad/jobs/oasis-router", Items: nomadapi.VariableItems{
		"tls_cert": string(sec.tlsCert), "tls_key": string(sec.tlsKey), "OASIS_UPSTREAM_KEY_TEST": sec.hostedKey}}, nil)
	must.NoError(t, err)
	_, _, err = stack.Nomad.Variables().Create(&nomadapi.Variable{Path: "nomad/jobs/oasis-kvcached/kvcached",
		Items: nomadapi.VariableItems{"redis_password": sec.redisPass}}, nil)
	must.NoError(t, err)
	digest := sha256.Sum256([]byte(sec.apiKey))
	keys, _ := json.Marshal(map[string]any{"keys": []map[string]string{{"id": "e2e", "sha256": hex.EncodeToString(digest[:])}}})
	_, err = stack.Consul.KV().Put(&consulapi.KVPair{Key: "oasis/router/keys", Value: keys}, nil)
	must.NoError(t, err)

	ports, err := testutil.FreePorts(4)
	must.NoError(t, err)
	common := map[string]string{"oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr, "nomad_addr": stack.NomadAddr}
	with := func(m map[string]string) map[string]string {
		for k, v := range common {
			m[k] = v
		}
		return m
	}
	t.Cleanup(func() {
		for _, id := range []string{hostedJobID, secretEngineJob, "oasis-router", "oasis-kvcached"} {
			_ = stack.StopJob(context.Background(), id)
		}
	})
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "kvcached.nomad.hcl"), with(map[string]string{
		"resp_port": strconv.Itoa(ports[1]), "http_port": strconv.Itoa(ports[2]), "quic_port": strconv.Itoa(ports[3]),
		"data_dir": t.TempDir(), "ram_bytes": "64MiB", "disk_bytes": "128MiB", "memory_mb": "256", "auth_enabled": "true"})))
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "router.nomad.hcl"), with(map[string]string{
		"http_port": strconv.Itoa(ports[0]), "tls_enabled": "true", "api_keys_kv": "true",
		"hosted_upstreams": fmt.Sprintf("[%q]", hostedURL),
		"hosted_key_envs":  fmt.Sprintf("[%q]", "OASIS_UPSTREAM_KEY_TEST="+hostedURL)})))
	runSecretEngine(t, ctx, sec.engineKey)
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "recipes", "hosted", "openai-compat", "fallback", "job.nomad.hcl"),
		map[string]string{"model": "hosted-m", "endpoint": hostedURL, "key_env": "OASIS_UPSTREAM_KEY_TEST"}))
	return "https://127.0.0.1:" + strconv.Itoa(ports[0]), net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
}

// secretEngineJob is an oasis-sim engine started with an API key (vLLM's --api-key) that its
// task renders from its Nomad variable into the environment and the driver config interpolates.
const secretEngineJob = "secret-engine"

func runSecretEngine(t *testing.T, ctx context.Context, key string) {
	_, _, err := stack.Nomad.Variables().Create(&nomadapi.Variable{Path: "nomad/jobs/" + secretEngineJob,
		Items: nomadapi.VariableItems{"api_key": key}}, nil)
	must.NoError(t, err)
	hcl := testbed.SimEngine{ID: secretEngineJob, Model: "secret-sim",
		Config: `extra_args = ["--api-key", "${ENGINE_API_KEY}"]`,
		Task: `template {
        data        = "{{ with nomadVar \"nomad/jobs/` + secretEngineJob + `\" }}ENGINE_API_KEY={{ .api_key | toJSON }}{{ end }}"
        destination = "secrets/engine.env"
        env         = true
      }`}.HCL()
	_, err = stack.RunJobHCL(ctx, hcl)
	must.NoError(t, err)
	entries, err := stack.WaitServicePassing(ctx, "oasis-engine", 1)
	must.NoError(t, err)
	var addr string
	for _, e := range entries {
		if e.Service.Meta["oasis_model"] == "secret-sim" {
			addr = net.JoinHostPort(e.Service.Address, strconv.Itoa(e.Service.Port))
		}
	}
	must.NotEq(t, "", addr, must.Sprint("the engine with a key is not registered"))
	// The key reached the engine: /v1 answers 401 without it and 200 with it.
	for key, want := range map[string]int{"": http.StatusUnauthorized, key: http.StatusOK} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		must.NoError(t, err)
		resp.Body.Close()
		must.Eq(t, want, resp.StatusCode)
	}
}

func waitRouterServes(t *testing.T, ctx context.Context, client *http.Client, url, apiKey string) {
	body := `{"model":"hosted-m","messages":[{"role":"user","content":"hello"}]}`
	var last string
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = resp.Status + " " + string(b)
		return resp.StatusCode == http.StatusOK
	}), wait.Timeout(90*time.Second), wait.Gap(500*time.Millisecond)), must.Func(func() string { return "last answer: " + last }))

	// Without the key: 401.
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, http.StatusUnauthorized, resp.StatusCode)
}

func checkKvcachedPassword(t *testing.T, ctx context.Context, addr, password string) {
	anon := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer anon.Close()
	err := anon.Set(ctx, "k", "v", 0).Err()
	must.ErrorContains(t, err, "NOAUTH")
	authed := redis.NewClient(&redis.Options{Addr: addr, Password: password, MaxRetries: -1})
	defer authed.Close()
	must.NoError(t, authed.Set(ctx, "k", "v", 0).Err())
}

// checkRouterPrivileges: with only its role, the router wrote the default routing policy, and with
// its workload identity it reads Nomad node statistics (the hosted engine's node) without error.
func checkRouterPrivileges(t *testing.T, ctx context.Context, r *routerProc) {
	pair, _, err := stack.Consul.KV().Get("oasis/router/policy", (&consulapi.QueryOptions{}).WithContext(ctx))
	must.NoError(t, err)
	must.NotNil(t, pair, must.Sprint("the router did not write its default policy"))
	var ok, failed float64
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		reads := r.metrics(t)["oasis_router_nomad_node_stats_reads_total"]
		ok, failed = reads["result=ok"], reads["result=error"]
		return ok > 0
	}), wait.Timeout(30*time.Second), wait.Gap(time.Second)), must.Func(func() string {
		return fmt.Sprintf("node statistics reads: %v ok, %v failed", ok, failed)
	}))
	must.Eq(t, 0.0, failed, must.Sprint("the router's Nomad token could not read node statistics"))
}

// nomadAndConsulViews is what an operator (or anyone with read access) sees of the jobs: each
// job, each allocation with its task events, each task's stdout and stderr, and every Consul
// service instance with its meta, tags and check output. Keys name the view.
func nomadAndConsulViews(t *testing.T, ctx context.Context, jobIDs []string) map[string]string {
	views := map[string]string{}
	add := func(name string, v any) {
		// As the CLI prints it: no \u003c for '<'.
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		must.NoError(t, enc.Encode(v))
		views[name] = b.String()
	}
	for _, id := range jobIDs {
		job, _, err := stack.Nomad.Jobs().Info(id, nil)
		must.NoError(t, err)
		add("job "+id, job)
		allocs, _, err := stack.Nomad.Jobs().Allocations(id, true, nil)
		must.NoError(t, err)
		for _, stub := range allocs {
			alloc, _, err := stack.Nomad.Allocations().Info(stub.ID, nil)
			must.NoError(t, err)
			add("allocation of "+id, alloc)
			for task := range alloc.TaskStates {
				for _, stream := range []string{"stdout", "stderr"} {
					lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					text, err := stack.TaskLog(lctx, alloc.ID, task, stream)
					cancel()
					must.NoError(t, err)
					views[fmt.Sprintf("%s of task %s (%s)", stream, task, id)] = text
				}
			}
		}
	}
	services, _, err := stack.Consul.Catalog().Services(nil)
	must.NoError(t, err)
	for name := range services {
		entries, _, err := stack.Consul.Health().Service(name, "", false, nil)
		must.NoError(t, err)
		add("consul service "+name, entries)
	}
	must.Greater(t, 6, len(views), must.Sprint("too few views collected to mean anything"))
	return views
}
