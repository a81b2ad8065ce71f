package provider

import (
	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/resource"
)

// consulResources are the resources that live in Consul KV.
func consulResources() []func() resource.Resource {
	return []func() resource.Resource{newPolicyResource, newAPIKeyResource}
}

// consulDataSources read what the router reads from Consul.
func consulDataSources() []func() datasource.DataSource {
	return []func() datasource.DataSource{newPoolDataSource}
}
