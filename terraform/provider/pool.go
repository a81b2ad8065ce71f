package provider

import (
	"context"
	"fmt"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/oasis-llm/oasis/router/discovery"
)

type poolDataSource struct{ c *Clients }

var _ datasource.DataSourceWithConfigure = (*poolDataSource)(nil)

func newPoolDataSource() datasource.DataSource { return &poolDataSource{} }

type poolModel struct {
	Service         types.String     `tfsdk:"service"`
	Tag             types.String     `tfsdk:"tag"`
	HostedUpstreams []string         `tfsdk:"hosted_upstreams"`
	HostedKeyEnvs   []string         `tfsdk:"hosted_key_envs"`
	ModelNames      []string         `tfsdk:"model_names"`
	Models          []poolModelEntry `tfsdk:"models"`
}

type poolModelEntry struct {
	Name      string         `tfsdk:"name" json:"name"`
	Instances []poolInstance `tfsdk:"instances" json:"instances"`
}

type poolInstance struct {
	ID      string `tfsdk:"id" json:"id"`
	Address string `tfsdk:"address" json:"address"`
	Engine  string `tfsdk:"engine" json:"engine"`
	Role    string `tfsdk:"role" json:"role"`
	Node    string `tfsdk:"node" json:"node"`
}

func (d *poolDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_pool"
}

func (d *poolDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	str := func(desc string) schema.Attribute { return schema.StringAttribute{Computed: true, Description: desc} }
	resp.Schema = schema.Schema{
		Description: "The models and healthy engine instances the router sees, computed with the router's " +
			"own discovery code: the passing instances of the service in Consul, less those the router refuses.",
		Attributes: map[string]schema.Attribute{
			"service": schema.StringAttribute{Optional: true,
				Description: "The engines' Consul service (default " + discovery.EngineService + ")."},
			"tag": schema.StringAttribute{Optional: true, Description: "Only instances with this tag."},
			"hosted_upstreams": schema.ListAttribute{Optional: true, ElementType: types.StringType,
				Description: "The router's -hosted-upstreams: hosted endpoints (oasis_upstream) it allows; default none."},
			"hosted_key_envs": schema.ListAttribute{Optional: true, ElementType: types.StringType,
				Description: "The router's -hosted-key-envs: key variables (oasis_upstream_key_env) it allows."},
			"model_names": schema.ListAttribute{Computed: true, ElementType: types.StringType,
				Description: "The models with at least one instance, sorted."},
			"models": schema.ListNestedAttribute{Computed: true,
				Description: "Each model, sorted by name, with its instances sorted by id.",
				NestedObject: schema.NestedAttributeObject{Attributes: map[string]schema.Attribute{
					"name": str("The model (oasis_model)."),
					"instances": schema.ListNestedAttribute{Computed: true,
						NestedObject: schema.NestedAttributeObject{Attributes: map[string]schema.Attribute{
							"id":      str("Consul service instance id."),
							"address": str("host:port the router sends requests to."),
							"engine":  str("oasis_engine."),
							"role":    str("oasis_role: both, prefill or decode."),
							"node":    str("oasis_node: the Nomad node id."),
						}}},
				}}},
		},
	}
}

func (d *poolDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	c, err := clientsFrom(req.ProviderData)
	if err != nil {
		resp.Diagnostics.AddError("Configuring oasis_pool", err.Error())
		return
	}
	d.c = c
}

func (d *poolDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var m poolModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if err := d.read(ctx, &m); err != nil {
		resp.Diagnostics.AddError("Reading the router's pool", err.Error())
		return
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &m)...)
}

// read fills m's outputs: one discovery query, then the router's Pool.Set,
// which drops the instances the router would refuse.
func (d *poolDataSource) read(ctx context.Context, m *poolModel) error {
	hosted, err := discovery.ParseHostedPolicy(m.HostedUpstreams, m.HostedKeyEnvs)
	if err != nil {
		return fmt.Errorf("hosted_upstreams, hosted_key_envs: %w", err)
	}
	src := &discovery.Consul{Client: d.c.Consul, Service: m.Service.ValueString(), Tag: m.Tag.ValueString()}
	instances, err := src.Instances(ctx)
	if err != nil {
		return err
	}
	pool := discovery.New(discovery.Config{Hosted: hosted})
	pool.Set(instances)
	m.ModelNames = pool.Models()
	m.Models = make([]poolModelEntry, 0, len(m.ModelNames))
	for _, name := range m.ModelNames {
		e := poolModelEntry{Name: name}
		for _, w := range pool.Workers(name) { // sorted by id
			e.Instances = append(e.Instances, poolInstance{ID: w.ID, Address: w.Address,
				Engine: w.Engine, Role: w.Role, Node: w.Node})
		}
		m.Models = append(m.Models, e)
	}
	return nil
}
