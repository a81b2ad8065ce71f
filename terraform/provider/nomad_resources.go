package provider

import "github.com/hashicorp/terraform-plugin-framework/resource"

// nomadResources are the resources that are Nomad jobs.
func nomadResources() []func() resource.Resource {
	return []func() resource.Resource{newModelResource, newSystemJobsResource}
}
