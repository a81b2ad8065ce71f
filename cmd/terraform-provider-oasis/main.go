// Command terraform-provider-oasis is the OpenTofu/Terraform provider for
// Oasis deployments: models, router policy, API keys and the system jobs,
// validated at plan time with Oasis's own code (terraform/README.md).
package main

import (
	"context"
	"flag"
	"log"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"

	"github.com/oasis-llm/oasis/terraform/provider"
)

// version is set at build time (-ldflags "-X main.version=..."); the
// filesystem mirror's directory names the same version.
var version = provider.DefaultVersion

func main() {
	debug := flag.Bool("debug", false, "run with support for debuggers (prints TF_REATTACH_PROVIDERS)")
	flag.Parse()
	err := providerserver.Serve(context.Background(), provider.New(version), providerserver.ServeOpts{
		Address: provider.Address,
		Debug:   *debug,
	})
	if err != nil {
		log.Fatal(err)
	}
}
