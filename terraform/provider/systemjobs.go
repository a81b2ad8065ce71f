package provider

import (
	"context"
	"fmt"
	"maps"
	"sync"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/booldefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/listdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/oasis-llm/oasis/jobs"
)

// The system jobs' ids, as their jobspecs name them.
const (
	routerJobID   = "oasis-router"
	kvcachedJobID = "oasis-kvcached"
)

// embeddedJobs parses the embedded jobspecs' variable blocks once.
var embeddedJobs = sync.OnceValues(func() (map[string]*jobFile, error) {
	out := map[string]*jobFile{}
	for attrName, f := range map[string]struct{ name, src string }{
		"router_variables":   {"jobs/router.nomad.hcl", jobs.Router},
		"kvcached_variables": {"jobs/kvcached.nomad.hcl", jobs.Kvcached},
	} {
		jf, err := parseJobFile(f.name, f.src)
		if err != nil {
			return nil, err
		}
		out[attrName] = jf
	}
	return out, nil
})

var (
	_ resource.ResourceWithConfigure      = (*systemJobsResource)(nil)
	_ resource.ResourceWithValidateConfig = (*systemJobsResource)(nil)
	_ resource.ResourceWithModifyPlan     = (*systemJobsResource)(nil)
	_ resource.ResourceWithImportState    = (*systemJobsResource)(nil)
)

// systemJobsResource is oasis_system_jobs.
type systemJobsResource struct{ c *Clients }

func newSystemJobsResource() resource.Resource { return &systemJobsResource{} }

// systemJobsModel is oasis_system_jobs' state and plan.
type systemJobsModel struct {
	ID                types.String `tfsdk:"id"`
	Region            types.String `tfsdk:"region"`
	Datacenters       types.List   `tfsdk:"datacenters"`
	RouterVariables   types.Map    `tfsdk:"router_variables"`
	KvcachedEnabled   types.Bool   `tfsdk:"kvcached_enabled"`
	KvcachedVariables types.Map    `tfsdk:"kvcached_variables"`
	RouterJobID       types.String `tfsdk:"router_job_id"`
	KvcachedJobID     types.String `tfsdk:"kvcached_job_id"`
	RouterHash        types.String `tfsdk:"router_hash"`
	KvcachedHash      types.String `tfsdk:"kvcached_hash"`
}

func (r *systemJobsResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_system_jobs"
}

func (r *systemJobsResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "The oasis-router and oasis-kvcached system jobs of one region, from the jobspecs " +
			"in the repository's jobs/ directory (embedded in the provider) and their variables.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The region."},
			"region": schema.StringAttribute{Optional: true, Computed: true,
				Description: "Nomad region (default the provider's nomad_region, else the agent's)."},
			"datacenters": schema.ListAttribute{ElementType: types.StringType, Optional: true, Computed: true,
				Default:     listdefault.StaticValue(types.ListValueMust(types.StringType, []attr.Value{types.StringValue("*")})),
				Description: "Datacenters both jobs run in (default [\"*\"])."},
			"router_variables": schema.MapAttribute{ElementType: types.StringType, Optional: true,
				Description: "Variables of jobs/router.nomad.hcl other than region and datacenters (lists as [\"a\",\"b\"])."},
			"kvcached_enabled": schema.BoolAttribute{Optional: true, Computed: true, Default: booldefault.StaticBool(true),
				Description: "Run oasis-kvcached too."},
			"kvcached_variables": schema.MapAttribute{ElementType: types.StringType, Optional: true,
				Description: "Variables of jobs/kvcached.nomad.hcl other than region and datacenters."},
			"router_job_id":   schema.StringAttribute{Computed: true, PlanModifiers: keep},
			"kvcached_job_id": schema.StringAttribute{Computed: true},
			"router_hash": schema.StringAttribute{Computed: true,
				Description: "Hash of the router's jobspec and variables, as recorded in the job's meta oasis_tf_hash."},
			"kvcached_hash": schema.StringAttribute{Computed: true,
				Description: "Hash of kvcached's jobspec and variables, as recorded in the job's meta oasis_tf_hash."},
		},
	}
}

func (r *systemJobsResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	c, err := clientsFrom(req.ProviderData)
	if err != nil {
		resp.Diagnostics.AddError("Configuring oasis_system_jobs", err.Error())
		return
	}
	r.c = c
}

// ValidateConfig checks every variable against the jobspec's declarations:
// an unknown name or a value not of the variable's type fails the plan on
// that map key.
func (r *systemJobsResource) ValidateConfig(ctx context.Context, req resource.ValidateConfigRequest, resp *resource.ValidateConfigResponse) {
	var m systemJobsModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	files, err := embeddedJobs()
	if err != nil {
		resp.Diagnostics.AddError("Reading the embedded jobspecs", err.Error())
		return
	}
	for attrName, v := range map[string]types.Map{"router_variables": m.RouterVariables, "kvcached_variables": m.KvcachedVariables} {
		vars, known := stringMap(ctx, v, &resp.Diagnostics)
		if !known {
			continue
		}
		_, errs := files[attrName].assignments(vars)
		for _, e := range errs {
			resp.Diagnostics.AddAttributeError(path.Root(attrName).AtMapKey(e.Name), "Invalid oasis_system_jobs",
				fmt.Sprintf("%s[%q]: %s", attrName, e.Name, e.Msg))
		}
	}
}

// stringMap reads a map(string); known is false when the map or a value is
// not known yet.
func stringMap(ctx context.Context, v types.Map, d *diag.Diagnostics) (map[string]string, bool) {
	if v.IsUnknown() {
		return nil, false
	}
	out := map[string]string{}
	if v.IsNull() {
		return out, true
	}
	for _, e := range v.Elements() {
		if e.IsUnknown() {
			return nil, false
		}
	}
	d.Append(v.ElementsAs(ctx, &out, false)...)
	return out, true
}

// submission is what is registered for one job.
type submission struct {
	jobID     string
	src       string
	variables string
	hash      string
}

// submissions renders the variables files of the jobs m runs. known is
// false when the plan does not know a value yet.
func submissions(ctx context.Context, m systemJobsModel, d *diag.Diagnostics) (router, kvcached *submission, known bool) {
	if m.Region.IsUnknown() || m.Datacenters.IsUnknown() || m.KvcachedEnabled.IsUnknown() {
		return nil, nil, false
	}
	files, err := embeddedJobs()
	if err != nil {
		d.AddError("Reading the embedded jobspecs", err.Error())
		return nil, nil, false
	}
	var dcs []string
	d.Append(m.Datacenters.ElementsAs(ctx, &dcs, false)...)
	build := func(attrName, jobID string, v types.Map) (*submission, bool) {
		vars, ok := stringMap(ctx, v, d)
		if !ok {
			return nil, false
		}
		jf := files[attrName]
		text, errs := jf.jobVariables(m.Region.ValueString(), dcs, vars)
		for _, e := range errs {
			d.AddAttributeError(path.Root(attrName).AtMapKey(e.Name), "Invalid oasis_system_jobs", e.Msg)
		}
		return &submission{jobID: jobID, src: jf.Src, variables: text, hash: submissionHash(jf.Src, text)}, true
	}
	router, ok := build("router_variables", routerJobID, m.RouterVariables)
	if !ok {
		return nil, nil, false
	}
	if m.KvcachedEnabled.ValueBool() {
		if kvcached, ok = build("kvcached_variables", kvcachedJobID, m.KvcachedVariables); !ok {
			return nil, nil, false
		}
	}
	return router, kvcached, true
}

// ModifyPlan plans the region and the hashes of what would be submitted;
// a hash other than the one read back from a job plans an update.
func (r *systemJobsResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.Plan.Raw.IsNull() {
		return
	}
	var plan, config systemJobsModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.Config.Get(ctx, &config)...)
	var state *systemJobsModel
	if !req.State.Raw.IsNull() {
		state = &systemJobsModel{}
		resp.Diagnostics.Append(req.State.Get(ctx, state)...)
	}
	if resp.Diagnostics.HasError() {
		return
	}
	var stateRegion *types.String
	if state != nil {
		stateRegion = &state.Region
	}
	plan.Region = plannedRegion(config.Region, stateRegion, r.c)
	if state != nil && !plan.Region.IsUnknown() && !plan.Region.Equal(state.Region) {
		resp.RequiresReplace = append(resp.RequiresReplace, path.Root("region"))
	}
	plan.ID = plan.Region
	plan.RouterJobID = types.StringValue(routerJobID)
	plan.RouterHash, plan.KvcachedHash = types.StringUnknown(), types.StringUnknown()
	plan.KvcachedJobID = types.StringNull()
	if plan.KvcachedEnabled.ValueBool() {
		plan.KvcachedJobID = types.StringValue(kvcachedJobID)
	}
	router, kvcached, known := submissions(ctx, plan, &resp.Diagnostics)
	if known {
		plan.RouterHash = types.StringValue(router.hash)
		plan.KvcachedHash = types.StringNull()
		if kvcached != nil {
			plan.KvcachedHash = types.StringValue(kvcached.hash)
		}
	}
	resp.Diagnostics.Append(resp.Plan.Set(ctx, &plan)...)
}

// plannedRegion is the configured region, else the provider's, else the
// one in state; unknown when none says.
func plannedRegion(configured types.String, state *types.String, c *Clients) types.String {
	switch {
	case !configured.IsNull():
		return configured
	case c != nil && c.Region != "":
		return types.StringValue(c.Region)
	case state != nil:
		return *state
	}
	return types.StringUnknown()
}

func (r *systemJobsResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m systemJobsModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if !resp.Diagnostics.HasError() {
		r.apply(ctx, m, &resp.State, &resp.Diagnostics)
	}
}

func (r *systemJobsResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var m, old systemJobsModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &old)...)
	if resp.Diagnostics.HasError() {
		return
	}
	r.apply(ctx, m, &resp.State, &resp.Diagnostics)
	if resp.Diagnostics.HasError() || m.KvcachedEnabled.ValueBool() || old.KvcachedJobID.IsNull() {
		return
	}
	if err := stopJob(ctx, r.c.Nomad, kvcachedJobID, m.Region.ValueString(), ""); err != nil {
		resp.Diagnostics.AddError("Stopping oasis-kvcached", err.Error())
	}
}

// apply parses each jobspec with its variables on the Nomad servers (HCL2,
// exactly as `nomad job run -var-file` would), stamps the submission's
// hash in the job's meta and registers it.
func (r *systemJobsResource) apply(ctx context.Context, m systemJobsModel, st stateSetter, d *diag.Diagnostics) {
	if r.c == nil {
		d.AddError("oasis_system_jobs", "the provider is not configured")
		return
	}
	region, err := resolveRegion(ctx, r.c, m.Region.ValueString())
	if err != nil {
		d.AddError("Resolving the Nomad region", err.Error())
		return
	}
	m.Region, m.ID = types.StringValue(region), types.StringValue(region)
	router, kvcached, known := submissions(ctx, m, d)
	if d.HasError() || !known {
		if !d.HasError() {
			d.AddError("oasis_system_jobs", "values still unknown at apply")
		}
		return
	}
	m.RouterJobID, m.RouterHash = types.StringValue(routerJobID), types.StringValue(router.hash)
	m.KvcachedJobID, m.KvcachedHash = types.StringNull(), types.StringNull()
	for _, s := range []*submission{router, kvcached} {
		if s == nil {
			continue
		}
		if err := r.register(ctx, s, region); err != nil {
			d.AddError("Registering "+s.jobID, err.Error())
			d.Append(st.Set(ctx, &m)...)
			return
		}
	}
	if kvcached != nil {
		m.KvcachedJobID, m.KvcachedHash = types.StringValue(kvcachedJobID), types.StringValue(kvcached.hash)
	}
	d.Append(st.Set(ctx, &m)...)
}

// register parses one submission server-side and registers the job.
func (r *systemJobsResource) register(ctx context.Context, s *submission, region string) error {
	job, err := r.c.Nomad.Jobs().ParseHCLOpts(&nomadapi.JobsParseRequest{
		JobHCL: s.src, Variables: s.variables, Canonicalize: true,
	})
	if err != nil {
		return fmt.Errorf("parsing %s with its variables: %w", s.jobID, err)
	}
	if job.ID == nil || *job.ID != s.jobID {
		return fmt.Errorf("parsing %s: the jobspec names job %q", s.jobID, deref(job.ID))
	}
	meta := map[string]string{metaManagedBy: managedByThis, metaHash: s.hash}
	maps.Copy(meta, job.Meta)
	meta[metaHash] = s.hash
	job.Meta = meta
	w := &nomadapi.WriteOptions{Region: region}
	if _, _, err := r.c.Nomad.Jobs().Register(job, w.WithContext(ctx)); err != nil {
		return fmt.Errorf("registering %s in region %s: %w", s.jobID, region, err)
	}
	return nil
}

// Read removes the resource when the router job is gone or stopped, and
// reads each job's submission hash from its meta: a job resubmitted
// outside Terraform (or a kvcached job gone) plans an update.
func (r *systemJobsResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m systemJobsModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || r.c == nil {
		return
	}
	region := m.Region.ValueString()
	router, err := jobInfo(ctx, r.c.Nomad, routerJobID, region, "")
	if err != nil {
		resp.Diagnostics.AddError("Reading oasis-router", err.Error())
		return
	}
	if router == nil {
		resp.State.RemoveResource(ctx)
		return
	}
	m.RouterHash = types.StringValue(router.Meta[metaHash])
	if m.KvcachedEnabled.IsNull() || m.KvcachedEnabled.ValueBool() {
		kv, err := jobInfo(ctx, r.c.Nomad, kvcachedJobID, region, "")
		if err != nil {
			resp.Diagnostics.AddError("Reading oasis-kvcached", err.Error())
			return
		}
		m.KvcachedHash = types.StringValue("")
		if kv != nil {
			m.KvcachedHash = types.StringValue(kv.Meta[metaHash])
		}
		if m.KvcachedEnabled.IsNull() { // import
			m.KvcachedEnabled = types.BoolValue(kv != nil)
			if kv == nil {
				m.KvcachedHash = types.StringNull()
			} else {
				m.KvcachedJobID = types.StringValue(kvcachedJobID)
			}
		}
	}
	if m.Datacenters.IsNull() {
		dcs, d := types.ListValueFrom(ctx, types.StringType, router.Datacenters)
		resp.Diagnostics.Append(d...)
		m.Datacenters = dcs
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *systemJobsResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m systemJobsModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() || r.c == nil {
		return
	}
	ids := []string{routerJobID}
	if !m.KvcachedJobID.IsNull() {
		ids = append(ids, kvcachedJobID)
	}
	for _, id := range ids {
		if err := stopJob(ctx, r.c.Nomad, id, m.Region.ValueString(), ""); err != nil {
			resp.Diagnostics.AddError("Deleting "+id, err.Error())
		}
	}
}

// ImportState takes the region. The variables cannot be read back from
// the jobs: the next plan shows an update that resubmits them.
func (r *systemJobsResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("id"), req.ID)...)
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("region"), req.ID)...)
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("router_job_id"), routerJobID)...)
}
