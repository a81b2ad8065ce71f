// Package pluginclient launches a Nomad device plugin binary the way the
// Nomad client does (go-plugin, Nomad's handshake, gRPC, the base and device
// plugin services of internal/nomadplugin) and configures it the way Nomad's
// plugin loader does (the plugin's own hclspec, cty msgpack-encoded). It exists so `gpu-check` and the
// binary-level tests exercise the real plugin wire path without an agent.
package pluginclient

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

// Client is a running device plugin process.
type Client struct {
	Device device.DevicePlugin
	Info   *base.PluginInfoResponse
	client *plugin.Client
}

// Launch starts the plugin binary at path, checks that it is a device
// plugin, and applies config (the contents of the agent's `config { }`
// block, as HCL would decode it; nil for none).
func Launch(ctx context.Context, path string, config map[string]any, logger hclog.Logger) (*Client, error) {
	pc := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: base.Handshake,
		Plugins: map[string]plugin.Plugin{
			base.PluginTypeBase:   &base.PluginBase{},
			base.PluginTypeDevice: &device.PluginDevice{},
		},
		Cmd:              exec.CommandContext(ctx, path),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger,
	})
	c := &Client{client: pc}
	if err := c.start(config); err != nil {
		pc.Kill()
		return nil, err
	}
	return c, nil
}

func (c *Client) start(config map[string]any) error {
	rpc, err := c.client.Client()
	if err != nil {
		return fmt.Errorf("connecting to plugin: %w", err)
	}
	raw, err := rpc.Dispense(base.PluginTypeDevice)
	if err != nil {
		return fmt.Errorf("dispensing device plugin: %w", err)
	}
	dev, ok := raw.(device.DevicePlugin)
	if !ok {
		return fmt.Errorf("plugin does not implement the device plugin interface (%T)", raw)
	}
	info, err := dev.PluginInfo()
	if err != nil {
		return fmt.Errorf("reading plugin info: %w", err)
	}
	if info.Type != base.PluginTypeDevice {
		return fmt.Errorf("plugin type is %q, want %q", info.Type, base.PluginTypeDevice)
	}
	spec, err := dev.ConfigSchema()
	if err != nil {
		return fmt.Errorf("reading config schema: %w", err)
	}
	buf, err := EncodeConfig(spec, config)
	if err != nil {
		return err
	}
	if err := dev.SetConfig(&base.Config{PluginConfig: buf, ApiVersion: device.ApiVersion010}); err != nil {
		return fmt.Errorf("setting plugin config: %w", err)
	}
	c.Device, c.Info = dev, info
	return nil
}

// Pid is the plugin process id (0 once it has exited).
func (c *Client) Pid() int {
	if c.client.Exited() {
		return 0
	}
	rc := c.client.ReattachConfig()
	if rc == nil {
		return 0
	}
	return rc.Pid
}

// Exited reports whether the plugin process has ended.
func (c *Client) Exited() bool { return c.client.Exited() }

// Close stops the plugin process.
func (c *Client) Close() error {
	c.client.Kill()
	return nil
}

// EncodeConfig parses config against a plugin's schema, applying its
// defaults, and msgpack-encodes the result: what Nomad's plugin loader sends
// in SetConfig. A nil config is an empty block.
func EncodeConfig(spec *hclspec.Spec, config map[string]any) ([]byte, error) {
	if config == nil {
		config = map[string]any{}
	}
	buf, err := hclspec.Encode(spec, config)
	if err != nil {
		return nil, fmt.Errorf("encoding plugin config: %w", err)
	}
	return buf, nil
}
