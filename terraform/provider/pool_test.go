package provider

import (
	"context"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/discovery"
)

// The pool data source lists what the router would route to: passing
// instances with a model, hosted ones only when allowed, sorted.
func (b *testBed) testPool(t *testing.T) {
	ctx := context.Background()
	reg := func(id string, port int, status string, tags []string, meta map[string]string) {
		t.Helper()
		must.NoError(t, b.consul.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: id, Name: discovery.EngineService, Address: "127.0.0.1", Port: port, Tags: tags, Meta: meta,
			Check: &consulapi.AgentServiceCheck{TTL: "10m", Status: status},
		}))
	}
	pass := consulapi.HealthPassing
	reg("e2", 8002, pass, []string{"blue"}, map[string]string{discovery.MetaModel: "llama", discovery.MetaEngine: "vllm",
		discovery.MetaRole: "prefill", discovery.MetaNode: "n2"})
	reg("e1", 8001, pass, nil, map[string]string{discovery.MetaModel: "llama", discovery.MetaEngine: "vllm", discovery.MetaNode: "n1"})
	reg("e3", 8003, pass, nil, map[string]string{discovery.MetaModel: "gemma", discovery.MetaEngine: "sglang"})
	reg("no-model", 8004, pass, nil, map[string]string{discovery.MetaEngine: "vllm"})
	reg("sick", 8005, consulapi.HealthCritical, nil, map[string]string{discovery.MetaModel: "sick-model"})
	reg("hosted", 8006, pass, nil, map[string]string{discovery.MetaModel: "gpt", discovery.MetaEngine: "openai_compat",
		discovery.MetaUpstream: "https://api.example.com/v1"})

	tf := b.tofu(t, "testdata/pool", "t/pool")
	tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	var names, hosted, tagged []string
	must.NoError(t, tf.Output(ctx, "model_names", &names))
	must.NoError(t, tf.Output(ctx, "hosted_model_names", &hosted))
	must.NoError(t, tf.Output(ctx, "tagged_model_names", &tagged))
	must.Eq(t, []string{"gemma", "llama"}, names)
	must.Eq(t, []string{"gemma", "gpt", "llama"}, hosted)
	must.Eq(t, []string{"llama"}, tagged)

	var models []poolModelEntry
	must.NoError(t, tf.Output(ctx, "models", &models))
	must.Eq(t, []poolModelEntry{
		{Name: "gemma", Instances: []poolInstance{{ID: "e3", Address: "127.0.0.1:8003", Engine: "sglang", Role: "both"}}},
		{Name: "llama", Instances: []poolInstance{
			{ID: "e1", Address: "127.0.0.1:8001", Engine: "vllm", Role: "both", Node: "n1"},
			{ID: "e2", Address: "127.0.0.1:8002", Engine: "vllm", Role: "prefill", Node: "n2"},
		}},
	}, models)
}
