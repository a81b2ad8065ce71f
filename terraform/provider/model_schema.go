package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/booldefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64default"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/listdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"
)

// Defaults of oasis_model.
const (
	defaultModelCPU     = 500
	defaultModelMemory  = 1024
	defaultModelTimeout = "10m"
)

// modelModel is oasis_model's state and plan.
type modelModel struct {
	ID                   types.String  `tfsdk:"id"`
	Name                 types.String  `tfsdk:"name"`
	Region               types.String  `tfsdk:"region"`
	Namespace            types.String  `tfsdk:"namespace"`
	Datacenters          types.List    `tfsdk:"datacenters"`
	NodePool             types.String  `tfsdk:"node_pool"`
	Engine               types.String  `tfsdk:"engine"`
	Model                types.String  `tfsdk:"model"`
	Role                 types.String  `tfsdk:"role"`
	Count                types.Int64   `tfsdk:"engine_count"`
	PrefillCount         types.Int64   `tfsdk:"prefill_count"`
	DecodeCount          types.Int64   `tfsdk:"decode_count"`
	KVOffload            types.String  `tfsdk:"kv_offload"`
	KVOffloadSizeGB      types.Float64 `tfsdk:"kv_offload_size_gb"`
	KVOffloadTier        types.String  `tfsdk:"kv_offload_tier"`
	TensorParallelSize   types.Int64   `tfsdk:"tensor_parallel_size"`
	MaxModelLen          types.Int64   `tfsdk:"max_model_len"`
	GPUMemoryUtilization types.Float64 `tfsdk:"gpu_memory_utilization"`
	BlockSize            types.Int64   `tfsdk:"block_size"`
	ExtraArgs            types.List    `tfsdk:"extra_args"`
	EngineBinary         types.String  `tfsdk:"engine_binary"`
	EngineImage          types.String  `tfsdk:"engine_image"`
	Resources            types.Object  `tfsdk:"resources"`
	WaitHealthy          types.Bool    `tfsdk:"wait_healthy"`
	Timeout              types.String  `tfsdk:"timeout"`
	JobID                types.String  `tfsdk:"job_id"`
	HealthyInstances     types.Int64   `tfsdk:"healthy_instances"`
	SpecHash             types.String  `tfsdk:"spec_hash"`
}

// resourcesModel is the resources attribute.
type resourcesModel struct {
	CPU    types.Int64 `tfsdk:"cpu"`
	Memory types.Int64 `tfsdk:"memory"`
	GPUs   types.Int64 `tfsdk:"gpus"`
}

var resourcesAttrTypes = map[string]attr.Type{
	"cpu": types.Int64Type, "memory": types.Int64Type, "gpus": types.Int64Type,
}

func (r *modelResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		Description: "A model deployment: a Nomad service job of llm-driver engines registered in Consul as " +
			"oasis-engine with the meta the router reads. The job is rendered by the provider and checked " +
			"by the llm driver's own validation at plan time.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{Computed: true, Description: "<region>/<name>.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()}},
			"name": schema.StringAttribute{Required: true, PlanModifiers: replace,
				Description: "Served model name (what clients put in \"model\", the oasis_model meta). The job id is oasis-model-<name>."},
			"region": schema.StringAttribute{Optional: true, Computed: true,
				Description: "Nomad region (default the provider's nomad_region, else the agent's)."},
			"namespace": schema.StringAttribute{Optional: true, Computed: true, Default: stringdefault.StaticString("default"),
				PlanModifiers: replace, Description: "Nomad namespace."},
			"datacenters": schema.ListAttribute{ElementType: types.StringType, Optional: true, Computed: true,
				Default:     listdefault.StaticValue(types.ListValueMust(types.StringType, []attr.Value{types.StringValue("*")})),
				Description: "Datacenters to run in (default [\"*\"])."},
			"node_pool": schema.StringAttribute{Optional: true, Description: "Nomad node pool."},
			"engine": schema.StringAttribute{Required: true,
				Description: "llm driver engine: vllm, sglang, llama_cpp, trtllm or sim."},
			"model": schema.StringAttribute{Required: true, Description: "Model the engine loads (Hugging Face id or local path)."},
			"role": schema.StringAttribute{Optional: true, Computed: true, Default: stringdefault.StaticString(modelRoleBoth),
				Description: "both (engine_count whole engines) or disaggregated (prefill_count prefill and decode_count decode engines)."},
			"engine_count": schema.Int64Attribute{Optional: true, Computed: true, Default: int64default.StaticInt64(1),
				Description: "Engines with role both (`count` is a name Terraform reserves)."},
			"prefill_count": schema.Int64Attribute{Optional: true, Computed: true, Default: int64default.StaticInt64(1),
				Description: "Prefill engines with role disaggregated."},
			"decode_count": schema.Int64Attribute{Optional: true, Computed: true, Default: int64default.StaticInt64(1),
				Description: "Decode engines with role disaggregated."},
			"kv_offload": schema.StringAttribute{Optional: true,
				Description: "llm driver kv_offload (none, native, lmcache, kvcached, nixl, hicache, kvbm, flexkv); unset: none, or nixl when disaggregated."},
			"kv_offload_size_gb": schema.Float64Attribute{Optional: true, Description: "CPU KV cache size in GiB."},
			"kv_offload_tier": schema.StringAttribute{Optional: true,
				Description: "llm driver kv_offload_tier: a KV offload tier declared in Nomad variable oasis/tiers/<name>, read at plan time with the provider's Nomad token; exclusive with kv_offload and kv_offload_size_gb. The engines read it with their workload identity (the job's tasks get identity { file = true }); attach jobs/acl/nomad-oasis-tiers.hcl to the job."},
			"tensor_parallel_size":   schema.Int64Attribute{Optional: true, Description: "GPUs per engine (tensor-parallel ranks)."},
			"max_model_len":          schema.Int64Attribute{Optional: true, Description: "Longest context served."},
			"gpu_memory_utilization": schema.Float64Attribute{Optional: true, Description: "Fraction of GPU memory the engine may use."},
			"block_size":             schema.Int64Attribute{Optional: true, Description: "KV block (page) size in tokens (default 16 where the engine has one)."},
			"extra_args": schema.ListAttribute{ElementType: types.StringType, Optional: true,
				Description: "More engine arguments."},
			"engine_binary": schema.StringAttribute{Optional: true, Description: "The driver's binary: the engine executable on the node."},
			"engine_image":  schema.StringAttribute{Optional: true, Description: "Container image the engine runs from instead of a binary on the node ([registry/]name[:tag][@sha256:digest]); needs the llm plugin's container block."},
			"resources": schema.SingleNestedAttribute{Optional: true,
				Description: "Per-engine resources (default cpu 500 MHz, memory 1024 MiB, one GPU per tensor-parallel rank on GPU engines).",
				Attributes: map[string]schema.Attribute{
					"cpu":    schema.Int64Attribute{Optional: true, Computed: true, Default: int64default.StaticInt64(defaultModelCPU), Description: "MHz."},
					"memory": schema.Int64Attribute{Optional: true, Computed: true, Default: int64default.StaticInt64(defaultModelMemory), Description: "MiB."},
					"gpus":   schema.Int64Attribute{Optional: true, Description: "Devices nvidia/gpu per engine."},
				}},
			"wait_healthy": schema.BoolAttribute{Optional: true, Computed: true, Default: booldefault.StaticBool(true),
				Description: "Wait on create and update until every instance passes its Consul checks."},
			"timeout": schema.StringAttribute{Optional: true, Computed: true, Default: stringdefault.StaticString(defaultModelTimeout),
				Description: "How long create, update and delete wait (a Go duration)."},
			"job_id": schema.StringAttribute{Computed: true, Description: "The Nomad job id.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()}},
			"healthy_instances": schema.Int64Attribute{Computed: true,
				Description: "Instances passing in Consul when last read."},
			"spec_hash": schema.StringAttribute{Computed: true,
				Description: "Hash of the rendered job apart from its counts; a job changed outside Terraform reads back another."},
		},
	}
}
