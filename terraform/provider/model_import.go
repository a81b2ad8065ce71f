package provider

import (
	"context"
	"fmt"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// fromJob fills an imported model's attributes from its job: the first
// llm task's config, the groups and the job's placement.
func fromJob(ctx context.Context, job *nomadapi.Job, m *modelModel) diag.Diagnostics {
	var diags diag.Diagnostics
	if len(job.TaskGroups) == 0 || len(job.TaskGroups[0].Tasks) == 0 {
		diags.AddError("Importing oasis_model", fmt.Sprintf("job %s has no task", deref(job.ID)))
		return diags
	}
	g := job.TaskGroups[0]
	t := g.Tasks[0]
	c := t.Config
	m.Engine = types.StringValue(str(c["engine"]))
	m.Model = types.StringValue(str(c["model"]))
	// Counts default as in the schema; Read sets the groups' real ones.
	m.Count, m.PrefillCount, m.DecodeCount = types.Int64Value(1), types.Int64Value(1), types.Int64Value(1)
	m.Role = types.StringValue(modelRoleBoth)
	if deref(g.Name) != groupName(config.RoleBoth) {
		m.Role = types.StringValue(modelRoleDisaggregated)
	}
	if v := str(c["kv_offload"]); v != "" && !(v == config.OffloadNIXL && m.Role.ValueString() == modelRoleDisaggregated) {
		m.KVOffload = types.StringValue(v)
	}
	m.TensorParallelSize = optInt(c["tensor_parallel_size"])
	m.MaxModelLen = optInt(c["max_model_len"])
	m.BlockSize = optInt(c["block_size"])
	m.GPUMemoryUtilization = optFloat(c["gpu_memory_utilization"])
	m.KVOffloadSizeGB = optFloat(c["kv_offload_size_gb"])
	if v := str(c["kv_offload_tier"]); v != "" {
		m.KVOffloadTier = types.StringValue(v)
	}
	if v := str(c["binary"]); v != "" {
		m.EngineBinary = types.StringValue(v)
	}
	if v := str(c["image"]); v != "" {
		m.EngineImage = types.StringValue(v)
	}
	if args, ok := c["extra_args"].([]interface{}); ok && len(args) > 0 {
		vals := make([]attr.Value, len(args))
		for i, a := range args {
			vals[i] = types.StringValue(str(a))
		}
		m.ExtraArgs = types.ListValueMust(types.StringType, vals)
	}
	dcs, d := types.ListValueFrom(ctx, types.StringType, job.Datacenters)
	diags.Append(d...)
	m.Datacenters = dcs
	if p := deref(job.NodePool); p != "" && p != "default" {
		m.NodePool = types.StringValue(p)
	}
	if job.Namespace != nil {
		m.Namespace = types.StringValue(*job.Namespace)
	}
	diags.Append(importResources(t.Resources, m)...)
	return diags
}

// importResources reads the task's resources into the model.
func importResources(res *nomadapi.Resources, m *modelModel) diag.Diagnostics {
	rm := map[string]attr.Value{
		"cpu":    types.Int64Value(defaultModelCPU),
		"memory": types.Int64Value(defaultModelMemory),
		"gpus":   types.Int64Null(),
	}
	if res != nil {
		if res.CPU != nil {
			rm["cpu"] = types.Int64Value(int64(*res.CPU))
		}
		if res.MemoryMB != nil {
			rm["memory"] = types.Int64Value(int64(*res.MemoryMB))
		}
		for _, d := range res.Devices {
			if d.Name == "nvidia/gpu" && d.Count != nil {
				rm["gpus"] = types.Int64Value(int64(*d.Count))
			}
		}
	}
	obj, diags := types.ObjectValue(resourcesAttrTypes, rm)
	m.Resources = obj
	return diags
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func str(v interface{}) string {
	s, _ := v.(string)
	return s
}

func optInt(v interface{}) types.Int64 {
	if f, ok := v.(float64); ok && f != 0 {
		return types.Int64Value(int64(f))
	}
	return types.Int64Null()
}

func optFloat(v interface{}) types.Float64 {
	if f, ok := v.(float64); ok && f != 0 {
		return types.Float64Value(f)
	}
	return types.Float64Null()
}
