package provider

import (
	"context"
	"fmt"
	"strings"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-framework/types/basetypes"
)

var (
	_ resource.ResourceWithConfigure      = (*modelResource)(nil)
	_ resource.ResourceWithValidateConfig = (*modelResource)(nil)
	_ resource.ResourceWithModifyPlan     = (*modelResource)(nil)
	_ resource.ResourceWithImportState    = (*modelResource)(nil)
)

// modelResource is oasis_model.
type modelResource struct{ c *Clients }

func newModelResource() resource.Resource { return &modelResource{} }

func (r *modelResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_model"
}

func (r *modelResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	c, err := clientsFrom(req.ProviderData)
	if err != nil {
		resp.Diagnostics.AddError("Configuring oasis_model", err.Error())
		return
	}
	r.c = c
}

// ValidateConfig renders the job and runs it through the llm driver's own
// checks, so a bad engine, offload or size fails `plan` naming its
// attribute. Values not known yet (variables of other resources) skip the
// check; apply runs it again.
func (r *modelResource) ValidateConfig(ctx context.Context, req resource.ValidateConfigRequest, resp *resource.ValidateConfigResponse) {
	var m modelModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	disagg := m.Role.ValueString() == modelRoleDisaggregated
	if disagg && !m.Count.IsNull() {
		resp.Diagnostics.AddAttributeError(path.Root("engine_count"), "Invalid oasis_model",
			"engine_count is for role both; with role disaggregated set prefill_count and decode_count")
	}
	if !disagg && !m.Role.IsUnknown() && (!m.PrefillCount.IsNull() || !m.DecodeCount.IsNull()) {
		resp.Diagnostics.AddAttributeError(path.Root("role"), "Invalid oasis_model",
			"prefill_count and decode_count need role = \"disaggregated\"")
	}
	if !m.Timeout.IsNull() && !m.Timeout.IsUnknown() {
		if d, err := time.ParseDuration(m.Timeout.ValueString()); err != nil || d <= 0 {
			resp.Diagnostics.AddAttributeError(path.Root("timeout"), "Invalid oasis_model",
				fmt.Sprintf("%q is not a positive duration (e.g. \"10m\")", m.Timeout.ValueString()))
		}
	}
	if !modelKnown(m) {
		return
	}
	s, diags := toSpec(ctx, m)
	resp.Diagnostics.Append(diags...)
	if diags.HasError() {
		return
	}
	addProblems(&resp.Diagnostics, checkModel(s, policyOf(r.c)))
}

// addProblems turns problems into error diagnostics.
func addProblems(d *diag.Diagnostics, ps []problem) {
	for _, p := range ps {
		if len(p.Path.Steps()) == 0 {
			d.AddError("Invalid oasis_model", p.Msg)
			continue
		}
		d.AddAttributeError(p.Path, "Invalid oasis_model", p.Path.String()+": "+p.Msg)
	}
}

// modelKnown reports whether every value the renderer reads is known.
func modelKnown(m modelModel) bool {
	for _, v := range []attr.Value{m.Name, m.Datacenters, m.NodePool, m.Engine, m.Model, m.Role,
		m.Count, m.PrefillCount, m.DecodeCount, m.KVOffload, m.KVOffloadSizeGB, m.KVOffloadTier, m.TensorParallelSize,
		m.MaxModelLen, m.GPUMemoryUtilization, m.BlockSize, m.ExtraArgs, m.EngineBinary, m.EngineImage, m.Resources} {
		if v.IsUnknown() {
			return false
		}
	}
	if !m.Resources.IsNull() {
		for _, v := range m.Resources.Attributes() {
			if v.IsUnknown() {
				return false
			}
		}
	}
	return true
}

// toSpec applies the defaults to a config or plan with every value known.
func toSpec(ctx context.Context, m modelModel) (modelSpec, diag.Diagnostics) {
	var diags diag.Diagnostics
	s := modelSpec{
		Name:                 m.Name.ValueString(),
		Region:               m.Region.ValueString(),
		Namespace:            m.Namespace.ValueString(),
		NodePool:             m.NodePool.ValueString(),
		Engine:               m.Engine.ValueString(),
		Model:                m.Model.ValueString(),
		Role:                 orDefault(m.Role, modelRoleBoth),
		Count:                int(intOr(m.Count, 1)),
		PrefillCount:         int(intOr(m.PrefillCount, 1)),
		DecodeCount:          int(intOr(m.DecodeCount, 1)),
		KVOffload:            m.KVOffload.ValueString(),
		KVOffloadSizeGB:      m.KVOffloadSizeGB.ValueFloat64(),
		KVOffloadTier:        m.KVOffloadTier.ValueString(),
		TensorParallelSize:   int(m.TensorParallelSize.ValueInt64()),
		MaxModelLen:          int(m.MaxModelLen.ValueInt64()),
		GPUMemoryUtilization: m.GPUMemoryUtilization.ValueFloat64(),
		BlockSize:            int(m.BlockSize.ValueInt64()),
		EngineBinary:         m.EngineBinary.ValueString(),
		EngineImage:          m.EngineImage.ValueString(),
		CPU:                  defaultModelCPU,
		MemoryMB:             defaultModelMemory,
		Datacenters:          []string{"*"},
	}
	if !m.Datacenters.IsNull() {
		s.Datacenters = nil
		diags.Append(m.Datacenters.ElementsAs(ctx, &s.Datacenters, false)...)
	}
	if !m.ExtraArgs.IsNull() {
		diags.Append(m.ExtraArgs.ElementsAs(ctx, &s.ExtraArgs, false)...)
	}
	if !m.Resources.IsNull() {
		var res resourcesModel
		diags.Append(m.Resources.As(ctx, &res, basetypes.ObjectAsOptions{})...)
		s.CPU = int(intOr(res.CPU, defaultModelCPU))
		s.MemoryMB = int(intOr(res.Memory, defaultModelMemory))
		if !res.GPUs.IsNull() {
			s.GPUs = ptr(int(res.GPUs.ValueInt64()))
		}
	}
	return s, diags
}

func orDefault(v types.String, def string) string {
	if v.IsNull() || v.ValueString() == "" {
		return def
	}
	return v.ValueString()
}

func intOr(v types.Int64, def int64) int64 {
	if v.IsNull() {
		return def
	}
	return v.ValueInt64()
}

// ModifyPlan fills in what the plan can know: the region (the provider's
// default), the job id, and the hash of the job the plan would submit. A
// hash other than the one read back from the job plans an update.
func (r *modelResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.Plan.Raw.IsNull() {
		return
	}
	var plan, config modelModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.Config.Get(ctx, &config)...)
	if resp.Diagnostics.HasError() {
		return
	}
	var state *modelModel
	if !req.State.Raw.IsNull() {
		state = &modelModel{}
		resp.Diagnostics.Append(req.State.Get(ctx, state)...)
	}
	planRegion(&plan, config.Region, state, r.c, resp)
	if !plan.Name.IsUnknown() {
		plan.JobID = types.StringValue(modelJobID(plan.Name.ValueString()))
		if !plan.Region.IsUnknown() {
			plan.ID = types.StringValue(plan.Region.ValueString() + "/" + plan.Name.ValueString())
		}
	}
	plan.SpecHash = types.StringUnknown()
	if modelKnown(plan) {
		s, diags := toSpec(ctx, plan)
		resp.Diagnostics.Append(diags...)
		if h, err := specHash(renderModelJob(s)); err == nil {
			plan.SpecHash = types.StringValue(h)
		}
		// ValidateConfig may run before the provider is configured; the
		// clients' policy (driver_policy) is checked here.
		if r.c != nil && !diags.HasError() {
			if ps := checkModelTiers(ctx, s, r.c.DriverPolicy, r.c.tiers(s)); len(ps) > 0 {
				addProblems(&resp.Diagnostics, ps)
				return
			}
		}
	}
	if state != nil && plan.SpecHash.Equal(state.SpecHash) && plan.Count.Equal(state.Count) &&
		plan.PrefillCount.Equal(state.PrefillCount) && plan.DecodeCount.Equal(state.DecodeCount) {
		plan.HealthyInstances = state.HealthyInstances
	}
	resp.Diagnostics.Append(resp.Plan.Set(ctx, &plan)...)
}

// planRegion plans the region: the configured one, else the provider's,
// else the one in state; a change replaces the job.
func planRegion(plan *modelModel, configured types.String, state *modelModel, c *Clients, resp *resource.ModifyPlanResponse) {
	var stateRegion *types.String
	if state != nil {
		stateRegion = &state.Region
	}
	plan.Region = plannedRegion(configured, stateRegion, c)
	if state != nil && !plan.Region.IsUnknown() && !plan.Region.Equal(state.Region) {
		resp.RequiresReplace = append(resp.RequiresReplace, path.Root("region"))
	}
}

func (r *modelResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m modelModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	r.apply(ctx, m, &resp.State, &resp.Diagnostics)
}

func (r *modelResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var m modelModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	r.apply(ctx, m, &resp.State, &resp.Diagnostics)
}

// stateSetter is the part of tfsdk.State apply writes.
type stateSetter interface {
	Set(ctx context.Context, val any) diag.Diagnostics
}

// apply registers the rendered job, records it in state and, with
// wait_healthy, waits for its instances to pass in Consul. The state is set
// before waiting: a create that times out leaves a tainted resource, not an
// orphaned job.
func (r *modelResource) apply(ctx context.Context, m modelModel, st stateSetter, d *diag.Diagnostics) {
	if r.c == nil {
		d.AddError("oasis_model", "the provider is not configured")
		return
	}
	region, err := resolveRegion(ctx, r.c, m.Region.ValueString())
	if err != nil {
		d.AddError("Resolving the Nomad region", err.Error())
		return
	}
	m.Region = types.StringValue(region)
	s, diags := toSpec(ctx, m)
	d.Append(diags...)
	if d.HasError() {
		return
	}
	if ps := checkModelTiers(ctx, s, r.c.DriverPolicy, r.c.tiers(s)); len(ps) > 0 {
		addProblems(d, ps)
		return
	}
	job := renderModelJob(s)
	hash, err := specHash(job)
	if err != nil {
		d.AddError("Hashing the rendered job", err.Error())
		return
	}
	job.Meta = map[string]string{metaManagedBy: managedByThis, metaHash: hash}
	w := &nomadapi.WriteOptions{Region: region, Namespace: s.Namespace}
	if _, _, err := r.c.Nomad.Jobs().Register(job, w.WithContext(ctx)); err != nil {
		d.AddError("Registering the model's Nomad job", fmt.Sprintf("registering job %s in region %s: %v", *job.ID, region, err))
		return
	}
	m.JobID = types.StringValue(*job.ID)
	m.ID = types.StringValue(region + "/" + s.Name)
	m.SpecHash = types.StringValue(hash)
	m.HealthyInstances = types.Int64Value(0)
	if d.Append(st.Set(ctx, &m)...); d.HasError() {
		return
	}
	if !m.WaitHealthy.ValueBool() {
		if n, err := modelInstances(ctx, r.c.Consul, s.Name, true); err == nil {
			m.HealthyInstances = types.Int64Value(int64(n))
			d.Append(st.Set(ctx, &m)...)
		}
		return
	}
	want := s.Count
	if s.Role == modelRoleDisaggregated {
		want = s.PrefillCount + s.DecodeCount
	}
	wctx, cancel := context.WithTimeout(ctx, timeoutOf(m.Timeout))
	defer cancel()
	n, err := waitHealthy(wctx, r.c, s.Name, want, &nomadapi.QueryOptions{Region: region, Namespace: s.Namespace}, *job.ID)
	m.HealthyInstances = types.Int64Value(int64(n))
	d.Append(st.Set(ctx, &m)...)
	if err != nil {
		d.AddError("Waiting for the model's engines", err.Error())
	}
}

// timeoutOf parses the timeout attribute (validated at plan).
func timeoutOf(v types.String) time.Duration {
	if d, err := time.ParseDuration(v.ValueString()); err == nil && d > 0 {
		return d
	}
	d, _ := time.ParseDuration(defaultModelTimeout)
	return d
}

// Read refreshes the state from the job: gone or stopped removes the
// resource; counts (e.g. after `nomad job scale`) and the submitted hash
// are read back so the plan shows the drift.
func (r *modelResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m modelModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || r.c == nil {
		return
	}
	jobID := modelJobID(m.Name.ValueString())
	job, err := jobInfo(ctx, r.c.Nomad, jobID, m.Region.ValueString(), m.Namespace.ValueString())
	if err != nil {
		resp.Diagnostics.AddError("Reading the model's Nomad job", err.Error())
		return
	}
	if job == nil {
		resp.State.RemoveResource(ctx)
		return
	}
	if m.Engine.IsNull() {
		resp.Diagnostics.Append(fromJob(ctx, job, &m)...)
	}
	readCounts(job, &m)
	m.JobID = types.StringValue(jobID)
	m.SpecHash = types.StringValue(job.Meta[metaHash])
	if n, err := modelInstances(ctx, r.c.Consul, m.Name.ValueString(), true); err != nil {
		resp.Diagnostics.AddWarning("Counting the model's healthy instances", err.Error())
	} else {
		m.HealthyInstances = types.Int64Value(int64(n))
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

// readCounts copies the groups' counts into the model.
func readCounts(job *nomadapi.Job, m *modelModel) {
	for _, g := range job.TaskGroups {
		if g.Name == nil || g.Count == nil {
			continue
		}
		n := types.Int64Value(int64(*g.Count))
		switch *g.Name {
		case groupName(modelRoleBoth):
			m.Count = n
		case "prefill":
			m.PrefillCount = n
		case "decode":
			m.DecodeCount = n
		}
	}
}

func (r *modelResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m modelModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || r.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, timeoutOf(m.Timeout))
	defer cancel()
	jobID := modelJobID(m.Name.ValueString())
	if err := stopJob(ctx, r.c.Nomad, jobID, m.Region.ValueString(), m.Namespace.ValueString()); err != nil {
		resp.Diagnostics.AddError("Deleting the model's Nomad job", err.Error())
		return
	}
	if err := waitNoInstances(ctx, r.c.Consul, m.Name.ValueString()); err != nil {
		resp.Diagnostics.AddError("Deleting the model's Nomad job", err.Error())
	}
}

// ImportState takes "<region>/<name>", "<name>", or either with the job id
// (oasis-model-<name>) in place of the name.
func (r *modelResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	region, name, ok := strings.Cut(req.ID, "/")
	if !ok {
		region, name = "", req.ID
	}
	name = strings.TrimPrefix(name, modelJobPrefix)
	if region == "" && r.c != nil {
		var err error
		if region, err = resolveRegion(ctx, r.c, ""); err != nil {
			resp.Diagnostics.AddError("Importing oasis_model", err.Error())
			return
		}
	}
	for attrName, v := range map[string]attr.Value{
		"id": types.StringValue(region + "/" + name), "name": types.StringValue(name),
		"region": types.StringValue(region), "namespace": types.StringValue("default"),
		"wait_healthy": types.BoolValue(true), "timeout": types.StringValue(defaultModelTimeout),
	} {
		resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root(attrName), v)...)
	}
}
