// Command nomad-device-gpu-mock is nomad-device-gpu serving a mocked NVIDIA
// DGX A100 (internal/mocknvml: eight A100s with fixed
// readings) under the plugin name "nomad-device-gpu-mock". It exists for
// test/e2e/devicemock: a real Nomad agent fingerprints, schedules, reserves
// and collects statistics of GPUs through the same plugin code and wire
// protocol as on a GPU machine. Never install it on a real node.
package main

import (
	deviceplugin "github.com/oasis-llm/oasis/device-plugin"
	"github.com/oasis-llm/oasis/internal/mocknvml"
	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
)

// Name is the plugin name (and binary file name) the agent configures.
const Name = "nomad-device-gpu-mock"

// mockPlugin is the real plugin with its own name, so it loads beside
// nomad-device-gpu without either replacing the other.
type mockPlugin struct{ *deviceplugin.Plugin }

func (p mockPlugin) PluginInfo() (*base.PluginInfoResponse, error) {
	info, err := p.Plugin.PluginInfo()
	if err != nil {
		return nil, err
	}
	out := *info
	out.Name = Name
	return &out, nil
}

func main() {
	logger := base.NewServeLogger()
	device.Serve(mockPlugin{deviceplugin.New(logger, mocknvml.New().Server)}, logger)
}
