package jobcheck

import (
	"context"
	"maps"
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/tiers"
)

func job(config map[string]interface{}, gpus uint64) *nomadapi.Job {
	j := nomadapi.NewServiceJob("j", "j", "global", 50)
	g := nomadapi.NewTaskGroup("engine", 1)
	g.Networks = []*nomadapi.NetworkResource{{DynamicPorts: []nomadapi.Port{{Label: "http"}, {Label: "kv"}}}}
	t := nomadapi.NewTask("engine", "llm")
	t.Config = config
	t.Resources = &nomadapi.Resources{}
	if gpus > 0 {
		t.Resources.Devices = []*nomadapi.RequestedDevice{{Name: "nvidia/gpu", Count: &gpus}}
	}
	g.AddTask(t)
	g.AddTask(nomadapi.NewTask("sidecar", "raw_exec"))
	j.AddTaskGroup(g)
	return j
}

func TestCheck(t *testing.T) {
	base := func() map[string]interface{} {
		return map[string]interface{}{"engine": "vllm", "model": "m", "port": "http", "kv_events_port": "kv",
			"tensor_parallel_size": float64(2)}
	}
	cases := []struct {
		name   string
		mutate func(map[string]interface{})
		gpus   uint64
		want   string // "" = ok
	}{
		{"ok", func(map[string]interface{}) {}, 2, ""},
		{"tp above devices", func(map[string]interface{}) {}, 1, "tensor_parallel_size: 2 is larger than the 1 GPU(s)"},
		{"wrong type", func(c map[string]interface{}) { c["tensor_parallel_size"] = "two" }, 2, "tensor_parallel_size: wrong type: got string, want int"},
		{"unknown field", func(c map[string]interface{}) { c["tensor_parallelism"] = 2 }, 2, "tensor_parallelism: unknown field"},
		// The client's hclspec matches names exactly; encoding/json would not.
		{"key case", func(c map[string]interface{}) { c["Engine"] = c["engine"]; delete(c, "engine") }, 2, "Engine: unknown field"},
		{"port label", func(c map[string]interface{}) { c["port"] = "api" }, 2, `port: port label "api" is not in the group's network block; labels: http, kv`},
		{"combination", func(c map[string]interface{}) { c["kv_offload"] = "hicache" }, 2, `kv_offload: "hicache" is not supported by engine vllm`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mutate(c)
			res := Check(job(c, tc.gpus))
			must.Len(t, 1, res, must.Sprint("only llm tasks are checked"))
			if tc.want == "" {
				must.NoError(t, res[0].Err)
				must.StrContains(t, res[0].String(), `group "engine" task "engine": ok: vllm serve m --host 127.0.0.1 --port 20001`)
				return
			}
			must.ErrorContains(t, res[0].Err, tc.want)
			must.StrContains(t, res[0].String(), `group "engine" task "engine": `+tc.want)
		})
	}
}

// TestCheckBridge: a group in bridge networking renders the engine on the ports' "to" inside
// the namespace, and refuses what cannot work there.
func TestCheckBridge(t *testing.T) {
	cases := []struct {
		name   string
		mode   string
		config map[string]interface{}
		want   string // the rendered line, or an error
	}{
		{"host", "host", map[string]interface{}{"engine": "sim", "model": "m", "port": "http", "kv_events": false},
			"ok: oasis-sim serve m --host 127.0.0.1 --port 20001 "},
		{"bridge", "bridge", map[string]interface{}{"engine": "sim", "model": "m", "port": "http", "kv_events": false},
			"ok: oasis-sim serve m --host 0.0.0.0 --port 8000 "},
		{"bridge loopback", "bridge", map[string]interface{}{"engine": "sim", "model": "m", "port": "http", "kv_events": false, "bind_address": "127.0.0.1"},
			"ok: oasis-sim serve m --host 127.0.0.1 --port 8000 "},
		{"bridge disaggregated", "bridge", map[string]interface{}{"engine": "sim", "model": "m", "port": "http", "kv_events": false, "role": "prefill", "nixl_side_channel_port": "kv"},
			`role: role "prefill" advertises the engine's own address`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := job(tc.config, 0)
			j.TaskGroups[0].Networks = []*nomadapi.NetworkResource{{Mode: tc.mode,
				DynamicPorts: []nomadapi.Port{{Label: "http", To: 8000}, {Label: "kv"}}}}
			res := Check(j)
			must.Len(t, 1, res)
			must.StrContains(t, res[0].String(), tc.want)
		})
	}
}

// TestCheckMeta: the oasis_* meta the router reads must agree with the task
// config, in the group's and the task's services and in job/group/task meta.
func TestCheckMeta(t *testing.T) {
	cfg := map[string]interface{}{"engine": "sim", "model": "m", "served_model_name": "llama", "port": "http", "kv_events_port": "kv"}
	ok := map[string]string{"oasis_model": "llama", "oasis_engine": "sim", "oasis_role": "both", "oasis_block_size": "16", "oasis_node": "${node.unique.id}"}
	with := func(k, v string) map[string]string {
		m := maps.Clone(ok)
		m[k] = v
		return m
	}
	cases := []struct {
		name              string
		config            map[string]interface{}
		groupSvc, taskSvc map[string]string
		groupMeta         map[string]string
		svcTask           string // the group service's task
		want              string // "" = ok
	}{
		{name: "agrees", groupSvc: ok},
		{name: "block size", groupSvc: with("oasis_block_size", "32"),
			want: `service "oasis-engine" meta oasis_block_size: "32" contradicts the task's block_size ("16")`},
		{name: "model", groupSvc: with("oasis_model", "m"),
			want: `service "oasis-engine" meta oasis_model: "m" contradicts the task's served_model_name ("llama")`},
		{name: "engine", taskSvc: with("oasis_engine", "vllm"),
			want: `service "task-svc" meta oasis_engine: "vllm" contradicts the task's engine ("sim")`},
		{name: "role", groupSvc: with("oasis_role", "prefill"),
			want: `meta oasis_role: "prefill" contradicts the task's role ("both")`},
		{name: "empty block size is the router's 16", groupSvc: with("oasis_block_size", "")},
		{name: "empty block size with 32", config: map[string]interface{}{"block_size": float64(32)}, groupSvc: with("oasis_block_size", ""),
			want: `oasis_block_size: "" contradicts the task's block_size ("32")`},
		{name: "interpolated from group meta", groupSvc: with("oasis_block_size", "${NOMAD_META_oasis_block_size}"),
			groupMeta: map[string]string{"oasis_block_size": "64"},
			want:      `job/group/task meta oasis_block_size: "64" contradicts`},
		{name: "other interpolation left to the client", groupSvc: with("oasis_model", "${NOMAD_META_unknown}")},
		{name: "service of another task", groupSvc: with("oasis_role", "decode"), svcTask: "sidecar"},
		{name: "llama_cpp has no block size", config: map[string]interface{}{"engine": "llama_cpp", "kv_events_port": nil},
			groupSvc: map[string]string{"oasis_engine": "llama_cpp", "oasis_block_size": "16"},
			want:     `oasis_block_size: "16" contradicts the task's block_size ("")`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := maps.Clone(cfg)
			for k, v := range tc.config {
				if v == nil {
					delete(c, k)
					continue
				}
				c[k] = v
			}
			if c["engine"] == "llama_cpp" {
				c["kv_events"] = false
			}
			j := job(c, 0)
			g := j.TaskGroups[0]
			g.Meta = tc.groupMeta
			if tc.groupSvc != nil {
				g.Services = []*nomadapi.Service{{Name: "oasis-engine", TaskName: tc.svcTask, Meta: tc.groupSvc}}
			}
			if tc.taskSvc != nil {
				g.Tasks[0].Services = []*nomadapi.Service{{Name: "task-svc", Meta: tc.taskSvc}}
			}
			res := Check(j)
			must.Len(t, 1, res)
			if tc.want == "" {
				must.NoError(t, res[0].Err)
				return
			}
			must.ErrorContains(t, res[0].Err, tc.want)
		})
	}
}

// TestCheckLLMAPIOptions: llm_api_options arrives from Nomad's HCL parser as a
// list of one map (a block of attributes), as extra_env does.
func TestCheckLLMAPIOptions(t *testing.T) {
	cfg := map[string]interface{}{"engine": "trtllm", "model": "m", "port": "http",
		"llm_api_options": []interface{}{map[string]interface{}{"print_iter_log": "true"}}}
	res := Check(job(cfg, 1))
	must.Len(t, 1, res)
	must.NoError(t, res[0].Err)
	must.StrContains(t, res[0].String(), "--extra_llm_api_options ${NOMAD_TASK_DIR}/extra_llm_api_options.yaml")
	must.StrContains(t, string(res[0].Plan.Files[0].Content), "enable_iter_perf_stats: true\nprint_iter_log: true\n")

	cfg["llm_api_options"] = []interface{}{map[string]interface{}{"max_seq_len": "4096"}}
	res = Check(job(cfg, 1))
	must.ErrorContains(t, res[0].Err, `llm_api_options: unknown option "max_seq_len"`)
}

// fakeTiers is a tier source over fixed declarations.
type fakeTiers map[string]map[string]string

func (f fakeTiers) Tier(_ context.Context, name string) (*config.Tier, error) {
	items, ok := f[name]
	if !ok {
		return nil, &config.FieldError{Field: "kv_offload_tier", Msg: "tier " + name + ": " + config.ErrTierNotDeclared.Error()}
	}
	t, err := config.ParseTier(name, items)
	if err == nil && t.SecretPath != "" {
		t.Secret = "<" + t.SecretPath + ">"
	}
	return t, err
}

// TestCheckTier: a task's kv_offload_tier is read from the tier source,
// rendered, and checked for the identity the driver reads it with.
func TestCheckTier(t *testing.T) {
	src := fakeTiers{
		"node-kv": {"kind": "kvcached", "address": "${node.ip}:6380", "secret_path": "nomad/jobs/oasis-kvcached/kvcached", "secret_item": "redis_password"},
		"bad":     {"kind": "kvcached", "address": "${node.ip}:6380"},
		"nfs":     {"kind": "shared-fs", "path": "/mnt/kv", "size_gb": "8"},
		"nx":      {"kind": "nixl", "address": "10.0.0.9:5555"},
	}
	cases := []struct {
		name     string
		tier     string
		identity *nomadapi.WorkloadIdentity
		src      tiers.Source
		want     string // substring of the result line
	}{
		{"kvcached", "node-kv", &nomadapi.WorkloadIdentity{File: true}, src,
			"ok: oasis-sim serve m --host 127.0.0.1"},
		{"no identity", "node-kv", nil, src, "kv_offload_tier: the driver reads the tier at start with the task's workload identity"},
		{"identity not exposed", "node-kv", &nomadapi.WorkloadIdentity{}, src, "add identity { file = true }"},
		{"not declared", "other", &nomadapi.WorkloadIdentity{Env: true}, src, "kv_offload_tier: tier other: tier is not declared"},
		{"bad declaration", "bad", &nomadapi.WorkloadIdentity{File: true}, src, `tier "bad" (Nomad variable oasis/tiers/bad) item secret_path`},
		{"shared-fs", "nfs", &nomadapi.WorkloadIdentity{File: true}, src, `"spec_name":"SharedStorageOffloadingSpec"`},
		{"kind not rendered", "nx", &nomadapi.WorkloadIdentity{File: true}, src, `tier "nx" (Nomad variable oasis/tiers/nx) item kind: kind nixl is declared but not rendered`},
		{"no source", "node-kv", &nomadapi.WorkloadIdentity{File: true}, nil, "no tier source"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := job(map[string]interface{}{"engine": "sim", "model": "m", "port": "http", "kv_events_port": "kv", "kv_offload_tier": tc.tier}, 0)
			j.TaskGroups[0].Tasks[0].Identity = tc.identity
			res := CheckWith(context.Background(), j, Options{Policy: config.DefaultPolicy(), Tiers: tc.src})
			must.Len(t, 1, res)
			must.StrContains(t, res[0].String(), tc.want)
			if tc.name == "kvcached" {
				f := res[0].Plan.Files[0]
				must.True(t, f.Secret)
				must.EqOp(t, "${NOMAD_SECRETS_DIR}/lmcache.yaml", f.Path)
				must.StrContains(t, string(f.Content), `remote_url: "redis://:%3Cnomad%2Fjobs%2Foasis-kvcached%2Fkvcached%3E@127.0.0.1:6380"`)
			}
		})
	}
}
