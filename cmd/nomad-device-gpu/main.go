// Command nomad-device-gpu is Oasis's Nomad device plugin for NVIDIA GPUs
// (device id "nvidia/gpu"). Put it in the Nomad client's plugin_dir and
// enable it with a `plugin "nomad-device-gpu" { config { ... } }` block.
package main

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	deviceplugin "github.com/oasis-llm/oasis/device-plugin"
	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
)

func main() {
	logger := base.NewServeLogger()
	device.Serve(deviceplugin.New(logger, nvml.New()), logger)
}
