package provider

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// policyKeySuffix is the policy document's key below the router's -kv-prefix.
const policyKeySuffix = "/policy"

// policyTerms is the registry of scoring terms the router builds. Validation
// reads only the terms' names, so the cache terms need no cache state here.
func policyTerms() (*scoring.Registry, error) { return scoring.RouterRegistry(nil) }

// validatePolicy checks a document with the router's own parser.
func validatePolicy(doc string) error {
	reg, err := policyTerms()
	if err != nil {
		return fmt.Errorf("building the router's scoring terms: %w", err)
	}
	_, err = policy.Parse([]byte(doc), reg)
	return err
}

type policyResource struct{ c *Clients }

var (
	_ resource.ResourceWithConfigure      = (*policyResource)(nil)
	_ resource.ResourceWithValidateConfig = (*policyResource)(nil)
	_ resource.ResourceWithImportState    = (*policyResource)(nil)
	_ resource.ResourceWithModifyPlan     = (*policyResource)(nil)
)

func newPolicyResource() resource.Resource { return &policyResource{} }

type policyModel struct {
	Document    types.String `tfsdk:"document"`
	Key         types.String `tfsdk:"key"`
	ModifyIndex types.Int64  `tfsdk:"modify_index"`
}

func (r *policyResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_router_policy"
}

func (r *policyResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "The router's policy document in Consul KV (<kv_prefix>/policy), validated at plan " +
			"time by the router's own parser and written with check-and-set.",
		Attributes: map[string]schema.Attribute{
			"document": schema.StringAttribute{Required: true,
				Description: "The policy document, JSON (e.g. jsonencode({...})) or HCL, stored byte for byte."},
			"key": schema.StringAttribute{Computed: true,
				Description:   "The document's Consul KV key: <kv_prefix>/policy, or the imported key.",
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()}},
			"modify_index": schema.Int64Attribute{Computed: true,
				Description: "The key's Consul ModifyIndex as of the last write or refresh; updates check-and-set on it."},
		},
	}
}

func (r *policyResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	c, err := clientsFrom(req.ProviderData)
	if err != nil {
		resp.Diagnostics.AddError("Configuring oasis_router_policy", err.Error())
		return
	}
	r.c = c
}

func (r *policyResource) ValidateConfig(ctx context.Context, req resource.ValidateConfigRequest, resp *resource.ValidateConfigResponse) {
	var doc types.String
	resp.Diagnostics.Append(req.Config.GetAttribute(ctx, path.Root("document"), &doc)...)
	if resp.Diagnostics.HasError() || doc.IsNull() || doc.IsUnknown() {
		return
	}
	if err := validatePolicy(doc.ValueString()); err != nil {
		resp.Diagnostics.AddAttributeError(path.Root("document"), "Invalid router policy document",
			"document: "+err.Error())
	}
}

// ModifyPlan names the key a create will write, so the plan shows it.
func (r *policyResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if r.c == nil || req.Plan.Raw.IsNull() || !req.State.Raw.IsNull() {
		return
	}
	resp.Diagnostics.Append(resp.Plan.SetAttribute(ctx, path.Root("key"), r.c.KVPrefix+policyKeySuffix)...)
}

func (r *policyResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var m policyModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	key := r.c.KVPrefix + policyKeySuffix
	// The router writes its default document when the key is missing: adopt
	// whatever is there, as of this read.
	cur, err := kvGet(ctx, r.c.Consul, key)
	if err != nil {
		resp.Diagnostics.AddError("Creating the router policy", err.Error())
		return
	}
	var index uint64
	if cur != nil {
		index = cur.ModifyIndex
	}
	if err := r.write(ctx, &m, key, index); err != nil {
		resp.Diagnostics.AddError("Creating the router policy", err.Error())
		return
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *policyResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state policyModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if err := r.write(ctx, &plan, state.Key.ValueString(), uint64(state.ModifyIndex.ValueInt64())); err != nil {
		resp.Diagnostics.AddError("Updating the router policy", err.Error())
		return
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

// write stores m's document at key with check-and-set on index and fills
// m's key and modify_index. The document is validated again: one that was
// unknown at plan time (computed from another resource) is checked here.
func (r *policyResource) write(ctx context.Context, m *policyModel, key string, index uint64) error {
	if err := validatePolicy(m.Document.ValueString()); err != nil {
		return fmt.Errorf("document: %w", err)
	}
	next, err := kvCAS(ctx, r.c.Consul, key, []byte(m.Document.ValueString()), index)
	if errors.Is(err, errChanged) {
		return fmt.Errorf("%w: refresh (tofu plan) and apply again", err)
	}
	if err != nil {
		return err
	}
	m.Key = types.StringValue(key)
	m.ModifyIndex = types.Int64Value(int64(next))
	return nil
}

// Read refreshes the document and index from KV: an out-of-band edit shows
// as a diff, a deleted key removes the resource (the plan creates it).
func (r *policyResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var m policyModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	pair, err := kvGet(ctx, r.c.Consul, m.Key.ValueString())
	if err != nil {
		resp.Diagnostics.AddError("Reading the router policy", err.Error())
		return
	}
	if pair == nil {
		resp.State.RemoveResource(ctx)
		return
	}
	m.Document = types.StringValue(string(pair.Value))
	m.ModifyIndex = types.Int64Value(int64(pair.ModifyIndex))
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

func (r *policyResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var m policyModel
	resp.Diagnostics.Append(req.State.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if err := kvDeleteCAS(ctx, r.c.Consul, m.Key.ValueString(), uint64(m.ModifyIndex.ValueInt64())); err != nil {
		resp.Diagnostics.AddError("Deleting the router policy", err.Error())
	}
}

// ImportState takes the key path (oasis/router/policy); Read fills the rest.
func (r *policyResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	if req.ID == "" {
		resp.Diagnostics.AddError("Importing the router policy", "the import ID is the policy's Consul KV key, e.g. oasis/router/policy")
		return
	}
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("key"), req.ID)...)
}
