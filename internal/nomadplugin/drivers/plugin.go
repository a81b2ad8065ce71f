package drivers

import (
	"context"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	basepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/base"
	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
)

// PluginDriver serves and dispenses the Driver service through go-plugin.
type PluginDriver struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the driver served; nil in a client's plugin set.
	Impl DriverPlugin
}

// GRPCServer registers the Driver service.
func (p *PluginDriver) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	driverspb.RegisterDriverServer(s, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns a DriverPlugin that calls the driver over c (the
// Nomad client's side, which Oasis's tests play).
func (p *PluginDriver) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Client{
		Client:  &base.Client{Client: basepb.NewBasePluginClient(c), DoneCtx: ctx},
		driver:  driverspb.NewDriverClient(c),
		doneCtx: ctx,
	}, nil
}

// Serve serves impl as a Nomad task driver plugin (the base and driver
// services) to the agent that started this process; it returns when the
// agent ends the plugin.
func Serve(impl DriverPlugin, logger hclog.Logger) {
	base.Serve(plugin.PluginSet{
		base.PluginTypeBase:   &base.PluginBase{Impl: impl},
		base.PluginTypeDriver: &PluginDriver{Impl: impl},
	}, logger)
}
