// Package recipes checks every job in jobs/ and recipes/ against the real Nomad agent with the
// Oasis plugins loaded: it parses (server-side, as `nomad job run` does), validates and plans,
// decodes each llm task's config through the driver's own hclspec schema the way Nomad's client
// does, renders it, and compares the engine's argv, environment and files with a golden file —
// so a recipe that would launch wrong flags fails CI before it meets a GPU.
package recipes

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/render"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var stack *testbed.Stack

func TestMain(m *testing.M) {
	flag.Parse()
	// Bridge networking: the mesh recipes' engines run in their allocation's namespace.
	os.Exit(testbed.Main(m, testbed.Options{Bridge: true}, &stack))
}

// jobFile is one jobspec in the repository.
type jobFile struct {
	rel string // path relative to the repository root
	// local is true for jobs that must place on this machine (no GPU, two cores): the system
	// jobs and the simulator recipes. Hardware recipes may fail placement here, but only for
	// lack of hardware.
	local bool
}

func jobFiles(t *testing.T) []jobFile {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	var files []jobFile
	for _, pattern := range []string{"jobs/*.nomad.hcl", "recipes/*/*/*/*.nomad.hcl"} {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		must.NoError(t, err)
		for _, m := range matches {
			rel, _ := filepath.Rel(root, m)
			files = append(files, jobFile{rel: rel, local: strings.HasPrefix(rel, "jobs/") || strings.HasPrefix(rel, "recipes/tiny/")})
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].rel < files[j].rel })
	return files
}

// The recipe set the project promises (issue 9); a missing one fails here.
var requiredRecipes = []string{
	"llama3-8b/vllm/agg", "llama3-8b/vllm/agg-lmcache", "llama3-8b/vllm/agg-kvcached",
	"llama3-8b/vllm/agg-native-offload", "llama3-8b/vllm/disagg-nixl",
	"llama3-8b/sglang/agg", "llama3-8b/sglang/agg-hicache", "llama3-8b/sglang/agg-shared-fs", "llama3-8b/sglang/disagg",
	"llama3-70b/vllm/agg-tp4", "qwen3-8b/vllm/agg", "llama3-8b/llama-cpp/cpu",
	"hosted/openai-compat/fallback", "tiny/sim/agg", "tiny/sim/disagg", "tiny/sim/agg-mesh", "llama3-8b/vllm/agg-mesh",
}

func TestEveryRequiredRecipeExists(t *testing.T) {
	var have []string
	for _, f := range jobFiles(t) {
		have = append(have, filepath.Dir(strings.TrimPrefix(f.rel, "recipes/")))
	}
	for _, r := range requiredRecipes {
		must.SliceContains(t, have, r, must.Sprintf("recipes/%s has no job file", r))
	}
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	for _, j := range []string{"jobs/router.nomad.hcl", "jobs/kvcached.nomad.hcl"} {
		must.FileExists(t, filepath.Join(root, j))
	}
}

func TestJobsValidatePlanAndRender(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	for _, f := range jobFiles(t) {
		for _, v := range append([]variant{{}}, jobVariants[f.rel]...) {
			t.Run(f.rel+v.suffix, func(t *testing.T) { checkJob(t, root, f, v) })
		}
	}
}

// variant is a job rendered with some variables set; its golden file's name ends in suffix.
type variant struct {
	suffix string
	vars   map[string]string
}

// jobVariants are the non-default renderings pinned besides each file's defaults.
var jobVariants = map[string][]variant{
	"recipes/tiny/sim/disagg/job.nomad.hcl": {{"_sglang", map[string]string{"protocol": "sglang"}}},
}

func checkJob(t *testing.T, root string, f jobFile, v variant) {
	// The mesh recipes' sidecar variables for a test bed without Envoy; other files
	// declare none of them.
	vars := stack.MeshVariables()
	maps.Copy(vars, v.vars)
	job, err := stack.ParseJobFile(filepath.Join(root, f.rel), vars)
	must.NoError(t, err)

	resp, _, err := stack.Nomad.Jobs().Validate(job, nil)
	must.NoError(t, err)
	must.SliceEmpty(t, resp.ValidationErrors, must.Sprintf("validation: %s", resp.Error))
	if resp.Warnings != "" {
		t.Errorf("validation warnings: %s", resp.Warnings)
	}

	plan, _, err := stack.Nomad.Jobs().Plan(job, false, nil)
	must.NoError(t, err)
	for group, metric := range plan.FailedTGAllocs {
		if f.local {
			t.Errorf("group %s cannot be placed on the test bed: %s", group, describeMetric(metric))
			continue
		}
		// A hardware recipe on this GPU-less two-core machine may lack devices, CPU or
		// memory, and nothing else: a filtered driver or constraint is a real error.
		if metric.NodesEvaluated == 0 {
			t.Errorf("group %s evaluated no node: %s", group, describeMetric(metric))
		}
		for reason := range metric.ConstraintFiltered {
			if reason == "missing drivers" && envoySidecar(job, group) {
				continue // Nomad's default sidecar is Envoy in Docker, which this machine lacks
			}
			if reason != "missing devices" {
				t.Errorf("group %s filtered by %q, not for lack of hardware: %s", group, reason, describeMetric(metric))
			}
		}
		for dim := range metric.DimensionExhausted {
			if !strings.Contains(dim, "devices") && dim != "cpu" && dim != "memory" {
				t.Errorf("group %s exhausted %q, not hardware", group, dim)
			}
		}
	}

	var golden strings.Builder
	for _, tg := range job.TaskGroups {
		for _, task := range tg.Tasks {
			if task.Driver != "llm" {
				continue
			}
			fmt.Fprintf(&golden, "== group %s task %s\n", *tg.Name, task.Name)
			golden.WriteString(renderTask(t, tg, task))
		}
	}
	if golden.Len() == 0 {
		return // the system jobs run no engine
	}
	checkGolden(t, filepath.Join("testdata", strings.ReplaceAll(strings.TrimSuffix(f.rel, "/job.nomad.hcl"), "/", "_")+v.suffix+".golden"), golden.String())
}

// exampleTiers are the KV offload tier declarations the recipes' READMEs put into Nomad
// variables (oasis/tiers/<name>); the recipes reference them by name.
var exampleTiers = map[string]map[string]string{
	"node-kv": {"kind": "kvcached", "address": "127.0.0.1:6380", "size_gb": "8",
		"secret_path": "nomad/jobs/oasis-kvcached/kvcached", "secret_item": "redis_password"},
	"lmcache-server": {"kind": "lmcache-server", "address": "lmcache.service.consul:65432", "size_gb": "32"},
	"shared-fs":      {"kind": "shared-fs", "path": "/mnt/oasis-kv", "size_gb": "64"},
}

// renderTask decodes a task's config as Nomad's client does (hclspec → cty → msgpack → struct)
// and renders it with deterministic ports and GPUs.
func renderTask(t *testing.T, tg *nomadapi.TaskGroup, task *nomadapi.Task) string {
	t.Helper()
	buf, err := hclspec.Encode(config.TaskSpec, task.Config)
	must.NoError(t, err, must.Sprintf("task %s config does not fit the llm driver's schema", task.Name))
	var cfg config.TaskConfig
	if err := base.MsgPackDecode(buf, &cfg); err != nil {
		t.Fatalf("decoding task %s config %v: %v", task.Name, task.Config, err)
	}

	ports, namespaced := map[string]render.Port{}, false
	for _, n := range tg.Networks {
		namespaced = namespaced || n.Mode == "bridge"
		for i, p := range slices.Concat(n.ReservedPorts, n.DynamicPorts) {
			v := p.Value
			if v == 0 {
				v = 20000 + i
			}
			ports[p.Label] = render.Port{HostIP: "10.0.0.7", Value: v, To: p.To}
		}
	}
	var gpus []string
	if task.Resources != nil {
		for _, d := range task.Resources.Devices {
			if d.Name == "nvidia/gpu" && d.Count != nil {
				for i := range int(*d.Count) {
					gpus = append(gpus, fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i))
				}
			}
		}
	}
	in := render.Input{Config: cfg, Ports: ports, GPUs: gpus, LocalDir: "/alloc/task/local", SecretsDir: "/alloc/task/secrets", Namespaced: namespaced}
	if cfg.KVOffloadTier != "" {
		items, ok := exampleTiers[cfg.KVOffloadTier]
		if !ok {
			t.Fatalf("task %s names tier %q, which no recipe README declares (exampleTiers)", task.Name, cfg.KVOffloadTier)
		}
		tier, err := config.ParseTier(cfg.KVOffloadTier, items)
		must.NoError(t, err)
		if tier.SecretPath != "" {
			tier.Secret = "example-password"
		}
		in.Tier = tier
	}
	plan, err := render.Render(in)
	if err != nil {
		t.Fatalf("task %s renders no engine command: %v", task.Name, err)
	}
	// The oasis_* meta the router reads agrees with what the task renders (the check
	// nomad-driver-llm validate makes).
	for _, svc := range slices.Concat(tg.Services, task.Services) {
		if svc.TaskName != "" && svc.TaskName != task.Name {
			continue
		}
		must.NoError(t, plan.Config.CheckServiceMeta(fmt.Sprintf("service %q", svc.Name), svc.Meta))
	}

	var b strings.Builder
	if plan.NoProcess {
		b.WriteString("no process\n")
	}
	for _, a := range plan.Argv {
		fmt.Fprintf(&b, "argv %s\n", a)
	}
	keys := make([]string, 0, len(plan.Env))
	for k := range plan.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "env %s=%s\n", k, plan.Env[k])
	}
	for _, f := range plan.Files {
		fmt.Fprintf(&b, "file %s\n%s\n", f.Path, strings.TrimRight(string(f.Content), "\n"))
	}
	fmt.Fprintf(&b, "health %s\nmetrics %s\nkv_events %s\n", plan.HealthURL, plan.MetricsPath, plan.KVEventsEndpoint)
	return b.String()
}

// envoySidecar reports whether the group has a Connect sidecar run as Nomad's default task.
func envoySidecar(job *nomadapi.Job, group string) bool {
	for _, tg := range job.TaskGroups {
		if *tg.Name != group {
			continue
		}
		for _, svc := range tg.Services {
			if c := svc.Connect; c != nil && c.SidecarService != nil && c.SidecarTask == nil {
				return true
			}
		}
	}
	return false
}

func checkGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		must.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		must.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	must.NoError(t, err, must.Sprint("no golden file: run go test ./test/e2e/recipes -update"))
	must.Eq(t, string(want), got, must.Sprintf("rendered engine command differs from %s (run with -update if the change is intended)", path))
}

func describeMetric(m *nomadapi.AllocationMetric) string {
	return fmt.Sprintf("evaluated %d, filtered %d, constraints %v, classes %v, exhausted %v",
		m.NodesEvaluated, m.NodesFiltered, m.ConstraintFiltered, m.ClassFiltered, m.DimensionExhausted)
}
