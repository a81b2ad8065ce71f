// Command nomad-device-gpu is Oasis's Nomad device plugin for NVIDIA GPUs
// (device id "nvidia/gpu"). Put it in the Nomad client's plugin_dir and
// enable it with a `plugin "nomad-device-gpu" { config { ... } }` block.
package main

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	deviceplugin "github.com/oasis-llm/oasis/device-plugin"
)

func main() {
	plugins.Serve(func(logger hclog.Logger) interface{} {
		return deviceplugin.New(logger, nvml.New())
	})
}
