package device

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	basepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/base"
	devicepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/device"
)

// PluginDevice is the go-plugin GRPCPlugin of a device plugin: its server
// side serves Impl as Nomad's DevicePlugin service, its client side returns
// a DevicePlugin that calls a plugin process (with the base service's
// PluginInfo, ConfigSchema and SetConfig).
type PluginDevice struct {
	plugin.NetRPCUnsupportedPlugin
	Impl DevicePlugin
}

var _ plugin.GRPCPlugin = (*PluginDevice)(nil)

// GRPCServer registers the device service.
func (p *PluginDevice) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return fmt.Errorf("device plugin: no implementation to serve")
	}
	devicepb.RegisterDevicePluginServer(s, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns a DevicePlugin backed by conn. ctx ends when the
// plugin process exits; calls and streams then fail with ErrPluginShutdown.
func (p *PluginDevice) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return &client{
		BasePlugin: &base.Client{Client: basepb.NewBasePluginClient(conn), DoneCtx: ctx},
		client:     devicepb.NewDevicePluginClient(conn),
		doneCtx:    ctx,
	}, nil
}

// Serve serves impl as a Nomad device plugin (the base and device services)
// on the process's stdio handshake, as Nomad's client launches it. It
// returns when the client ends the plugin.
func Serve(impl DevicePlugin, logger hclog.Logger) {
	base.Serve(plugin.PluginSet{
		base.PluginTypeBase:   &base.PluginBase{Impl: impl},
		base.PluginTypeDevice: &PluginDevice{Impl: impl},
	}, logger)
}
