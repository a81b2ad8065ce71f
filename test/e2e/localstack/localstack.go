// Package localstack is `make up` / `make down`: the whole local stack — real Consul and Nomad
// agents with the Oasis plugins loaded, the system jobs in jobs/ and the demo recipe — under a
// home directory (the checkout's .oasis/), left running until Down.
package localstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// demoRecipe is run by `make up` after the system jobs: three simulated engines (meshRecipe
// with MESH=1: the same in bridge networking behind Connect sidecars; llamaRecipe with
// ENGINE=llama-cpp: real llama-server engines on CPU).
const (
	demoRecipe  = "recipes/tiny/sim/agg"
	meshRecipe  = "recipes/tiny/sim/agg-mesh"
	llamaRecipe = "recipes/tiny/llama-cpp/cpu"
)

// demoModel is the model the sim demo recipes serve; llamaModel the llama.cpp one's.
const (
	demoModel  = "tiny-sim"
	llamaModel = "tiny-llama"
)

// Engines `make up ENGINE=...` runs the demo on.
const (
	EngineSim      = "sim"
	EngineLlamaCpp = "llama-cpp"
)

// meshClientService is the client identity `make up MESH=1` tells the user to call the router
// as: jobs/mesh/oasis-router.hcl allows it.
const meshClientService = "oasis-client"

// Options is how `make up` runs.
type Options struct {
	// Mesh runs the stack in the Consul service mesh (MESH=1): bridge networking, the shipped
	// intentions (jobs/mesh), the router with mesh_enabled and the mesh demo recipe.
	Mesh bool
	// Tracing runs a Jaeger all-in-one as the trace backend (TRACING=1) and the router with
	// otlp_endpoint set to it.
	Tracing bool
	// Engine is the demo's engine (ENGINE=): EngineSim ("" too) or EngineLlamaCpp, real
	// llama-server engines serving a tiny random-weight model made at start.
	Engine string

	llamaModelPath string // the GGUF the llama.cpp recipe serves, once made
	// Autoscale runs the Nomad Autoscaler (AUTOSCALE=1; bin/nomad-autoscaler) against the stack's
	// Prometheus, so the demo recipe's `scaling` policy adds and removes engines.
	Autoscale bool
	// DemoVariables are extra variables for the demo recipe (tests: a smaller fleet, shorter
	// scaling windows); they win over Up's own.
	DemoVariables map[string]string

	otlpEndpoint string // the Jaeger's OTLP/HTTP receiver, once it runs
	// federated runs the router with its federation listener (make up DCS=n; see federate).
	federated bool
}

// StatePath is where Up leaves what Down needs.
func StatePath(home string) string { return filepath.Join(home, "stack.json") }

// Up starts the stack under home (unless one is already up there), runs the jobs and the demo
// recipe, and prints where everything is to out.
// engineUser is "" when home and every directory above it let other users through, so the llm
// driver's default user (nobody) reaches the engines' binaries under home; otherwise the name of
// home's owner (the checkout's user; root for a checkout under /root), whom the local stack's
// driver then runs engines as.
func engineUser(home string) (string, error) {
	abs, err := filepath.Abs(home)
	if err != nil {
		return "", err
	}
	for d := abs; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if errors.Is(err, os.ErrNotExist) && d == abs {
			continue // made by Up, traversable
		}
		if err != nil {
			return "", fmt.Errorf("checking %s: %w", d, err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			return ownerName(d)
		}
		if d == filepath.Dir(d) {
			return "", nil
		}
	}
}

// ownerName is the user name owning path (its uid when it has no name).
func ownerName(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("no owner for %s", path)
	}
	uid := strconv.FormatUint(uint64(sys.Uid), 10)
	if u, err := user.LookupId(uid); err == nil {
		return u.Username, nil
	}
	return uid, nil
}

// llmDefaultUser is the llm plugin option for engineUser ("" keeps the driver's default).
func llmDefaultUser(name string) string {
	if name == "" {
		return ""
	}
	return fmt.Sprintf("default_user = %q", name)
}

func Up(ctx context.Context, root, home string, out io.Writer, opts Options) (*testbed.Stack, error) {
	statePath := StatePath(home)
	if s, err := testbed.Load(statePath); err == nil {
		if _, err := s.Nomad.Agent().Self(); err == nil {
			fmt.Fprintln(out, "The local stack is already up.")
			printURLs(out, s, EnvPath(home), opts.model())
			return s, nil
		}
		return nil, fmt.Errorf("a stack state exists at %s but its Nomad does not answer; run `make down` first", statePath)
	}
	switch opts.Engine {
	case "", EngineSim:
	case EngineLlamaCpp:
		if opts.Mesh {
			return nil, errors.New("ENGINE=llama-cpp runs without MESH: there is no mesh llama.cpp recipe")
		}
	default:
		return nil, fmt.Errorf("unknown engine %q: %s or %s", opts.Engine, EngineSim, EngineLlamaCpp)
	}
	fmt.Fprintln(out, "Starting Consul and Nomad with the Oasis plugins (the first run builds the Oasis binaries) ...")
	runAs, err := engineUser(home)
	if err != nil {
		return nil, err
	}
	if runAs != "" {
		fmt.Fprintf(out, "  engines run as %s, the owner of %s: the llm driver's default user (nobody) cannot reach the stack's binaries through its parent directories\n", runAs, home)
	}
	llmConfig := ""
	if opts.Engine == EngineLlamaCpp {
		var server string
		if server, opts.llamaModelPath, err = prepareLlama(root, home, out); err != nil {
			return nil, err
		}
		llmConfig = fmt.Sprintf("binaries = { llama_cpp = %q }", server)
	}
	s, err := testbed.Start(ctx, testbed.Options{
		Dir:             filepath.Join(home, "stack"),
		Logf:            func(format string, args ...any) { fmt.Fprintf(out, "  "+format+"\n", args...) },
		Bridge:          opts.Mesh,
		LLMPluginConfig: llmConfig,
		LLMPluginExtra:  llmDefaultUser(runAs),
	})
	if err != nil {
		return nil, err
	}
	if err := s.Save(statePath); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	if err := writeEnvFile(home, s); err != nil {
		return nil, errors.Join(err, s.Close())
	}

	if opts.Mesh {
		if err := s.ApplyIntentions(ctx); err != nil {
			return s, err
		}
		fmt.Fprintln(out, "  applied jobs/mesh (intentions)")
	}
	var jaeger *testbed.Jaeger
	if opts.Tracing {
		if jaeger, err = s.RunJaeger(ctx, ""); err != nil {
			return s, err
		}
		opts.otlpEndpoint = jaeger.OTLP
		fmt.Fprintln(out, "  ran jaeger (trace backend, memory storage)")
	}
	if err := runJobs(ctx, root, home, s, out, opts); err != nil {
		return s, err
	}
	if opts.Mesh {
		// The job's plain oasis-router instance passing says nothing of its Connect-native one.
		if err := s.WaitConnectPassing(ctx, "oasis-router", 1); err != nil {
			return s, err
		}
	}
	if err := startPrometheus(ctx, s, home, out); err != nil {
		return s, err
	}
	if opts.Autoscale {
		if err := startAutoscaler(ctx, s, home, out); err != nil {
			return s, err
		}
	}
	printURLs(out, s, EnvPath(home), opts.model())
	if jaeger != nil {
		printTracing(out, s, jaeger, opts.model())
	}
	return s, nil
}

// model is the model the demo recipe serves.
func (o Options) model() string {
	if o.Engine == EngineLlamaCpp {
		return llamaModel
	}
	return demoModel
}

// runJobs runs the system jobs and the demo recipe on one stack (one region of a federation).
func runJobs(ctx context.Context, root, home string, s *testbed.Stack, out io.Writer, opts Options) error {
	files, err := jobFiles(root, out, opts)
	if err != nil {
		return err
	}
	vars, err := localVariables(s, home)
	if err != nil {
		return err
	}
	if opts.otlpEndpoint != "" {
		vars["router.nomad.hcl"]["otlp_endpoint"] = opts.otlpEndpoint
	}
	maps.Copy(vars["job.nomad.hcl"], opts.DemoVariables)
	if opts.Mesh {
		vars["router.nomad.hcl"]["mesh_enabled"] = "true"
		maps.Copy(vars["job.nomad.hcl"], s.MeshVariables())
	}
	if opts.llamaModelPath != "" {
		vars["job.nomad.hcl"]["model"] = opts.llamaModelPath
	}
	if opts.federated {
		port, err := testutil.FreePorts(1)
		if err != nil {
			return err
		}
		maps.Copy(vars["router.nomad.hcl"], map[string]string{
			"federation_enabled": "true",
			"federation_port":    fmt.Sprint(port[0]),
			"federation_dc":      s.Datacenter,
			"federation_models":  fmt.Sprintf("[%q]", demoModel),
		})
	}
	if err := kvcachedSecretAndTier(s, vars["kvcached.nomad.hcl"]["resp_port"]); err != nil {
		return err
	}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		fileVars := maps.Clone(vars[""])
		maps.Copy(fileVars, vars[filepath.Base(f)])
		if err := s.RunJobFile(ctx, f, fileVars); err != nil {
			return fmt.Errorf("%s: %w (the stack stays up for inspection; `make down` stops it)", rel, err)
		}
		if s.Region == "global" {
			fmt.Fprintf(out, "  ran %s\n", rel)
		} else {
			fmt.Fprintf(out, "  ran %s in region %s\n", rel, s.Region)
		}
	}
	return nil
}

// kvcachedSecretAndTier gives the stack's kvcached the password its job requires by default (a
// random one in nomad/jobs/oasis-kvcached/kvcached, kept when the variable exists) and declares it as the
// KV offload tier "node-kv", so engine jobs can name it (nomad-driver/README.md).
func kvcachedSecretAndTier(s *testbed.Stack, respPort string) error {
	const secretPath = kvcachedSecretPath
	v, _, err := s.Nomad.Variables().Peek(secretPath, nil)
	if err != nil {
		return fmt.Errorf("reading %s: %w", secretPath, err)
	}
	if v == nil || v.Items["redis_password"] == "" {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		if v == nil {
			v = &nomadapi.Variable{Path: secretPath, Items: nomadapi.VariableItems{}}
		}
		v.Items["redis_password"] = hex.EncodeToString(b)
		if _, _, err := s.Nomad.Variables().Update(v, nil); err != nil {
			return fmt.Errorf("writing %s: %w", secretPath, err)
		}
	}
	tier := &nomadapi.Variable{Path: "oasis/tiers/node-kv", Items: nomadapi.VariableItems{
		"kind": "kvcached", "address": "127.0.0.1:" + respPort,
		"secret_path": secretPath, "secret_item": "redis_password"}}
	if _, _, err := s.Nomad.Variables().Update(tier, nil); err != nil {
		return fmt.Errorf("declaring tier node-kv: %w", err)
	}
	return nil
}

// kvcachedSecretPath is the Nomad variable holding the stack's kvcached password (item
// redis_password): the kvcached task group's own path (jobs/README.md).
const kvcachedSecretPath = "nomad/jobs/oasis-kvcached/kvcached"

// KvcachedPassword is the password the stack's kvcached requires (make up generates it), for
// clients such as the observability test and the soak's load.
func KvcachedPassword(s *testbed.Stack) (string, error) {
	v, _, err := s.Nomad.Variables().Peek(kvcachedSecretPath, nil)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", kvcachedSecretPath, err)
	}
	if v == nil || v.Items["redis_password"] == "" {
		return "", fmt.Errorf("%s holds no redis_password", kvcachedSecretPath)
	}
	return v.Items["redis_password"], nil
}

// jobFiles lists the system jobs and the demo recipe, saying which ones do not exist yet.
func jobFiles(root string, out io.Writer, opts Options) ([]string, error) {
	demoRecipe := demoRecipe
	switch {
	case opts.Mesh:
		demoRecipe = meshRecipe
	case opts.Engine == EngineLlamaCpp:
		demoRecipe = llamaRecipe
	}
	jobs, err := filepath.Glob(filepath.Join(root, "jobs", "*.nomad.hcl"))
	if err != nil {
		return nil, err
	}
	sort.Strings(jobs)
	if len(jobs) == 0 {
		fmt.Fprintln(out, "  skipped jobs/: no *.nomad.hcl there yet")
	}
	demo, err := filepath.Glob(filepath.Join(root, demoRecipe, "*.nomad.hcl"))
	if err != nil {
		return nil, err
	}
	if len(demo) == 0 {
		fmt.Fprintf(out, "  skipped %s: not there yet\n", demoRecipe)
	}
	return append(jobs, demo...), nil
}

// localVariables sizes the jobs for one machine: free ports instead of the production static
// ones, small RAM/disk tiers, state under .oasis. Keys are job file names; "" applies to all.
func localVariables(s *testbed.Stack, home string) (map[string]map[string]string, error) {
	ports, err := testutil.FreePorts(4)
	if err != nil {
		return nil, err
	}
	port := func(i int) string { return fmt.Sprint(ports[i]) }
	kvcachedDir := filepath.Join(home, "kvcached")
	if s.Region != "global" {
		kvcachedDir += "-" + s.Datacenter
	}
	return map[string]map[string]string{
		"": {
			"region":        s.Region,
			"oasis_bin_dir": s.BinDir,
			"datacenters":   `["*"]`,
			"consul_addr":   s.ConsulAddr,
			"nomad_addr":    s.NomadAddr,
		},
		"router.nomad.hcl": {"http_port": port(0)},
		"job.nomad.hcl":    {}, // the demo recipe
		"kvcached.nomad.hcl": {
			"resp_port":  port(1),
			"http_port":  port(2),
			"quic_port":  port(3),
			"data_dir":   kvcachedDir,
			"ram_bytes":  "256MiB",
			"disk_bytes": "1GiB",
			"memory_mb":  "512",
		},
	}, nil
}

// EnvPath is the shell file Up writes: the agents' addresses and management tokens.
func EnvPath(home string) string { return filepath.Join(home, "env") }

// writeEnvFile writes the variables the nomad and consul CLIs read, tokens included, to a file
// only its owner can read, rather than printing tokens to the terminal.
func writeEnvFile(home string, s *testbed.Stack) error { return writeEnv(EnvPath(home), s) }

func writeEnv(path string, s *testbed.Stack) error {
	var b strings.Builder
	fmt.Fprintf(&b, "export NOMAD_ADDR=%s CONSUL_HTTP_ADDR=%s\n", s.NomadAddr, s.ConsulAddr)
	if s.NomadToken != "" {
		fmt.Fprintf(&b, "export NOMAD_TOKEN=%s CONSUL_HTTP_TOKEN=%s\n", s.NomadToken, s.ConsulToken)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func printURLs(out io.Writer, s *testbed.Stack, envPath, model string) {
	fmt.Fprintln(out)
	if s.Region != "global" {
		fmt.Fprintf(out, "Datacenter %s (Nomad region %s):\n", s.Datacenter, s.Region)
	}
	fmt.Fprintf(out, "Nomad UI:   %s/ui\n", s.NomadAddr)
	fmt.Fprintf(out, "Consul UI:  http://%s/ui\n", s.ConsulAddr)
	fmt.Fprintf(out, "Env:        . %s   (addresses and management tokens for the nomad and consul CLIs and UIs)\n", envPath)
	printPrometheus(out, filepath.Dir(envPath), s.Datacenter)
	printAutoscaler(out, filepath.Dir(envPath))
	routers, _, err := s.Consul.Health().Service("oasis-router", "", true, nil)
	var plain, mesh *consulapi.AgentService
	for _, r := range routers {
		if r.Service.Connect != nil && r.Service.Connect.Native {
			mesh = r.Service
		} else {
			plain = r.Service
		}
	}
	if err != nil || (plain == nil && mesh == nil) {
		fmt.Fprintln(out, "OpenAI API: no oasis-router registered yet (jobs/router.nomad.hcl not run)")
		return
	}
	body := chatBody(model, "Hello, Oasis!")
	if plain != nil {
		base := fmt.Sprintf("http://%s:%d/v1", plain.Address, plain.Port)
		fmt.Fprintf(out, "OpenAI API: %s\n", base)
		fmt.Fprintf(out, "Try:        curl -N %s/chat/completions -H 'Content-Type: application/json' \\\n", base)
		fmt.Fprintln(out, body)
	}
	if mesh != nil {
		fmt.Fprintf(out, "Mesh API:   %s:%d (Connect-native; intentions allow %s, jobs/mesh/oasis-router.hcl)\n", mesh.Address, mesh.Port, meshClientService)
		fmt.Fprintf(out, "Try:        . %s; bin/consul connect proxy -service %s -upstream oasis-router:9191 &\n", envPath, meshClientService)
		fmt.Fprintln(out, "            curl -N http://127.0.0.1:9191/v1/chat/completions -H 'Content-Type: application/json' \\")
		fmt.Fprintln(out, body)
	}
	fmt.Fprintln(out, "Stop:       make down")
}

// plainRouter is the OpenAI API base URL (.../v1) of a passing oasis-router instance outside the
// mesh, if there is one.
func plainRouter(s *testbed.Stack) (string, bool) {
	routers, _, err := s.Consul.Health().Service("oasis-router", "", true, nil)
	if err != nil {
		return "", false
	}
	for _, r := range routers {
		if r.Service.Connect == nil || !r.Service.Connect.Native {
			return fmt.Sprintf("http://%s:%d/v1", r.Service.Address, r.Service.Port), true
		}
	}
	return "", false
}

// chatBody is the curl argument printed after a Try line: a streamed chat completion of the demo
// model.
func chatBody(model, content string) string {
	return fmt.Sprintf(`              -d '{"model":%q,"stream":true,"messages":[{"role":"user","content":%q}]}'`, model, content)
}

// exampleTrace is the trace id printTracing suggests sending.
const exampleTrace = "4bf92f3577b34da6a3ce929d0e0e4736"

// printTracing says where the traces are and how to look at one.
func printTracing(out io.Writer, s *testbed.Stack, j *testbed.Jaeger, model string) {
	fmt.Fprintf(out, "Traces:     Jaeger at %s (OTLP/HTTP in at %s; query API only, no UI in this build)\n", j.Query, j.OTLP)
	routers, _, err := s.Consul.Health().Service("oasis-router", "", true, nil)
	if err != nil || len(routers) == 0 {
		return
	}
	r := routers[0].Service
	fmt.Fprintf(out, "Trace one:  curl -N http://%s:%d/v1/chat/completions -H 'Content-Type: application/json' \\\n", r.Address, r.Port)
	fmt.Fprintf(out, "              -H 'traceparent: 00-%s-00f067aa0ba902b7-01' \\\n", exampleTrace)
	fmt.Fprintln(out, chatBody(model, "Hello, Oasis!"))
	fmt.Fprintf(out, "            curl -s %s/api/traces/%s   (the router's spans, a few seconds later)\n", j.Query, exampleTrace)
}

// Down stops everything Up or UpFederation started under home and removes home.
func Down(home string, out io.Writer) error {
	if _, err := os.Stat(FederationStatePath(home)); err == nil {
		return downFederation(home, out)
	}
	s, err := testbed.Load(StatePath(home))
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(out, "Nothing to stop: no local stack is up.")
		return os.RemoveAll(home)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "Stopping jobs, Nomad and Consul ...")
	if err := s.Close(); err != nil {
		return err
	}
	if err := os.RemoveAll(home); err != nil && !errors.Is(err, syscall.ENOENT) {
		return err
	}
	fmt.Fprintln(out, "The local stack is down; nothing is left running.")
	return nil
}
