// Package provider is the Oasis provider for OpenTofu and Terraform
// (terraform-plugin-framework). It manages what the generic Nomad and
// Consul providers cannot check: model deployments validated by the llm
// driver's own code, the router's policy validated by the router's parser,
// API keys whose secret never reaches Consul, the system jobs, and the pool
// the router sees. Every check runs at plan time, so a bad field fails
// `plan` with its name instead of a task's start.
package provider

import (
	"context"
	"fmt"
	"os"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-framework/types/basetypes"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

const (
	// Address is the provider's source address: OpenTofu's default
	// registry host, so `source = "oasis-llm/oasis"` finds it in a
	// filesystem mirror laid out for that host.
	Address = "registry.opentofu.org/oasis-llm/oasis"
	// DefaultVersion is the version of a build that does not set one.
	DefaultVersion = "0.1.0"
	// DefaultKVPrefix is the router's default -kv-prefix.
	DefaultKVPrefix = "oasis/router"
)

// New returns the provider factory providerserver serves.
func New(version string) func() provider.Provider {
	return func() provider.Provider { return &oasisProvider{version: version} }
}

type oasisProvider struct{ version string }

// providerModel is the provider block.
type providerModel struct {
	NomadAddress     types.String `tfsdk:"nomad_address"`
	NomadToken       types.String `tfsdk:"nomad_token"`
	NomadRegion      types.String `tfsdk:"nomad_region"`
	ConsulAddress    types.String `tfsdk:"consul_address"`
	ConsulToken      types.String `tfsdk:"consul_token"`
	ConsulDatacenter types.String `tfsdk:"consul_datacenter"`
	KVPrefix         types.String `tfsdk:"kv_prefix"`
	DriverPolicy     types.Object `tfsdk:"driver_policy"`
}

// driverPolicyModel is the provider's driver_policy: what the clients' llm
// plugin config allows, which the provider cannot read from the cluster.
type driverPolicyModel struct {
	AllowTaskBinary types.Bool `tfsdk:"allow_task_binary"`
}

// Clients is what Configure hands resources and data sources.
type Clients struct {
	Nomad  *nomadapi.Client
	Consul *consulapi.Client
	// Region is the provider's default Nomad region ("" : the agent's).
	Region string
	// KVPrefix is the router's Consul KV prefix (policy and keys below it).
	KVPrefix string
	// DriverPolicy is the llm plugin policy oasis_model is checked against
	// (the provider's driver_policy; unset: the plugin's defaults).
	DriverPolicy config.Policy
}

func (p *oasisProvider) Metadata(_ context.Context, _ provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = "oasis"
	resp.Version = p.version
}

func (p *oasisProvider) Schema(_ context.Context, _ provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Oasis deployments on Nomad and Consul. Addresses and tokens default to the " +
			"environment the nomad and consul CLIs read (NOMAD_ADDR, NOMAD_TOKEN, NOMAD_REGION, " +
			"NOMAD_CACERT..., CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT...).",
		Attributes: map[string]schema.Attribute{
			"nomad_address": schema.StringAttribute{Optional: true,
				Description: "Nomad HTTP API URL (default $NOMAD_ADDR, else http://127.0.0.1:4646)."},
			"nomad_token": schema.StringAttribute{Optional: true, Sensitive: true,
				Description: "Nomad ACL token (default $NOMAD_TOKEN)."},
			"nomad_region": schema.StringAttribute{Optional: true,
				Description: "Region for resources that do not name one (default $NOMAD_REGION, else the agent's)."},
			"consul_address": schema.StringAttribute{Optional: true,
				Description: "Consul HTTP address (default $CONSUL_HTTP_ADDR, else 127.0.0.1:8500)."},
			"consul_token": schema.StringAttribute{Optional: true, Sensitive: true,
				Description: "Consul ACL token (default $CONSUL_HTTP_TOKEN)."},
			"consul_datacenter": schema.StringAttribute{Optional: true,
				Description: "Consul datacenter (default the agent's)."},
			"kv_prefix": schema.StringAttribute{Optional: true,
				Description: "The router's -kv-prefix: its policy is <kv_prefix>/policy, its keys <kv_prefix>/keys (default " + DefaultKVPrefix + ")."},
			"driver_policy": schema.SingleNestedAttribute{Optional: true,
				Description: "What the Nomad clients' llm plugin config allows, mirroring its options; oasis_model is checked " +
					"against it at plan. Unset: the plugin's defaults (no task binaries).",
				Attributes: map[string]schema.Attribute{
					"allow_task_binary": schema.BoolAttribute{Optional: true,
						Description: "The clients' plugin config sets allow_task_binary = true: oasis_model may set engine_binary (default false)."},
				}},
		},
	}
}

func (p *oasisProvider) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var m providerModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	c, err := newClients(m)
	if err != nil {
		resp.Diagnostics.AddError("Configuring the Oasis provider", err.Error())
		return
	}
	if !m.DriverPolicy.IsNull() && !m.DriverPolicy.IsUnknown() {
		var dp driverPolicyModel
		resp.Diagnostics.Append(m.DriverPolicy.As(ctx, &dp, basetypes.ObjectAsOptions{})...)
		if resp.Diagnostics.HasError() {
			return
		}
		c.DriverPolicy.AllowTaskBinary = dp.AllowTaskBinary.ValueBool()
	}
	resp.ResourceData = c
	resp.DataSourceData = c
}

// newClients builds the API clients from the provider block over the
// environment's defaults. It dials nothing: a plan that needs no API
// (validation only) works without a cluster.
func newClients(m providerModel) (*Clients, error) {
	nc := nomadapi.DefaultConfig()
	if v := m.NomadAddress.ValueString(); v != "" {
		nc.Address = v
	}
	if v := m.NomadToken.ValueString(); v != "" {
		nc.SecretID = v
	}
	region := os.Getenv("NOMAD_REGION")
	if v := m.NomadRegion.ValueString(); v != "" {
		region = v
	}
	nc.Region = region
	nomad, err := nomadapi.NewClient(nc)
	if err != nil {
		return nil, fmt.Errorf("nomad client: %w", err)
	}
	cc := consulapi.DefaultConfig()
	if v := m.ConsulAddress.ValueString(); v != "" {
		cc.Address = v
	}
	if v := m.ConsulToken.ValueString(); v != "" {
		cc.Token = v
	}
	if v := m.ConsulDatacenter.ValueString(); v != "" {
		cc.Datacenter = v
	}
	consul, err := consulapi.NewClient(cc)
	if err != nil {
		return nil, fmt.Errorf("consul client: %w", err)
	}
	prefix := m.KVPrefix.ValueString()
	if prefix == "" {
		prefix = DefaultKVPrefix
	}
	return &Clients{Nomad: nomad, Consul: consul, Region: region, KVPrefix: prefix, DriverPolicy: config.DefaultPolicy()}, nil
}

func (p *oasisProvider) Resources(context.Context) []func() resource.Resource {
	return append(consulResources(), nomadResources()...)
}

func (p *oasisProvider) DataSources(context.Context) []func() datasource.DataSource {
	return consulDataSources()
}

// clientsFrom is the Configure step every resource and data source shares:
// nil data (the provider is not configured yet, as in ValidateConfig) is
// not an error.
func clientsFrom(data any) (*Clients, error) {
	if data == nil {
		return nil, nil
	}
	c, ok := data.(*Clients)
	if !ok {
		return nil, fmt.Errorf("unexpected provider data %T", data)
	}
	return c, nil
}
