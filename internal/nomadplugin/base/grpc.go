package base

import (
	"context"
	"fmt"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
	basepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/base"
)

// PluginBase serves and dispenses the BasePlugin service through
// go-plugin.
type PluginBase struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is the plugin served; nil in a client's plugin set.
	Impl BasePlugin
}

// GRPCServer registers the BasePlugin service.
func (p *PluginBase) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	basepb.RegisterBasePluginServer(s, &server{impl: p.Impl})
	return nil
}

// GRPCClient returns a BasePlugin that calls the plugin over c.
func (p *PluginBase) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Client{Client: basepb.NewBasePluginClient(c), DoneCtx: ctx}, nil
}

// Serve serves plugins (PluginBase and the plugin's own kind) to the Nomad
// agent that started this process, and returns when the agent ends it.
func Serve(plugins plugin.PluginSet, logger hclog.Logger) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         plugins,
		GRPCServer:      plugin.DefaultGRPCServer,
		Logger:          logger,
	})
}

// NewServeLogger is the logger a plugin serves with: JSON on stderr, which
// go-plugin hands to the agent's log at each line's level.
func NewServeLogger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, JSONFormat: true})
}

type server struct {
	basepb.UnimplementedBasePluginServer
	impl BasePlugin
}

func (s *server) PluginInfo(context.Context, *basepb.PluginInfoRequest) (*basepb.PluginInfoResponse, error) {
	info, err := s.impl.PluginInfo()
	if err != nil {
		return nil, err
	}
	t, err := typeToProto(info.Type)
	if err != nil {
		return nil, err
	}
	return &basepb.PluginInfoResponse{
		Type:              t,
		PluginApiVersions: info.PluginApiVersions,
		PluginVersion:     info.PluginVersion,
		Name:              info.Name,
	}, nil
}

func (s *server) ConfigSchema(context.Context, *basepb.ConfigSchemaRequest) (*basepb.ConfigSchemaResponse, error) {
	spec, err := s.impl.ConfigSchema()
	if err != nil {
		return nil, err
	}
	return &basepb.ConfigSchemaResponse{Spec: spec}, nil
}

// SetConfig passes the agent's driver settings to task drivers only, as
// Nomad's own SDK does.
func (s *server) SetConfig(_ context.Context, req *basepb.SetConfigRequest) (*basepb.SetConfigResponse, error) {
	info, err := s.impl.PluginInfo()
	if err != nil {
		return nil, err
	}
	agent := &AgentConfig{}
	if d := req.GetNomadConfig().GetDriver(); d != nil && info.Type == PluginTypeDriver {
		agent.Driver = &ClientDriverConfig{ClientMinPort: uint(d.GetClientMinPort()), ClientMaxPort: uint(d.GetClientMaxPort())}
	}
	cfg := &Config{PluginConfig: req.GetMsgpackConfig(), AgentConfig: agent, ApiVersion: req.GetPluginApiVersion()}
	if err := s.impl.SetConfig(cfg); err != nil {
		return nil, fmt.Errorf("SetConfig failed: %w", err)
	}
	return &basepb.SetConfigResponse{}, nil
}

func typeToProto(t string) (basepb.PluginType, error) {
	switch t {
	case PluginTypeDriver:
		return basepb.PluginType_DRIVER, nil
	case PluginTypeDevice:
		return basepb.PluginType_DEVICE, nil
	}
	return basepb.PluginType_UNKNOWN, fmt.Errorf("plugin info: unknown plugin type %q", t)
}

func typeFromProto(t basepb.PluginType) string {
	switch t {
	case basepb.PluginType_DRIVER:
		return PluginTypeDriver
	case basepb.PluginType_DEVICE:
		return PluginTypeDevice
	}
	return "unknown"
}

// Client calls a plugin's BasePlugin service: the agent's side, which
// Oasis's tests and tools (gpu-check) play.
type Client struct {
	Client basepb.BasePluginClient
	// DoneCtx ends when the plugin connection does.
	DoneCtx context.Context
}

var _ BasePlugin = (*Client)(nil)

// PluginInfo asks the plugin what it is.
func (c *Client) PluginInfo() (*PluginInfoResponse, error) {
	resp, err := c.Client.PluginInfo(c.DoneCtx, &basepb.PluginInfoRequest{})
	if err != nil {
		return nil, err
	}
	return &PluginInfoResponse{
		Type:              typeFromProto(resp.GetType()),
		PluginApiVersions: resp.GetPluginApiVersions(),
		PluginVersion:     resp.GetPluginVersion(),
		Name:              resp.GetName(),
	}, nil
}

// ConfigSchema asks for the plugin's configuration schema.
func (c *Client) ConfigSchema() (*hclspec.Spec, error) {
	resp, err := c.Client.ConfigSchema(c.DoneCtx, &basepb.ConfigSchemaRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetSpec(), nil
}

// SetConfig configures the plugin.
func (c *Client) SetConfig(cfg *Config) error {
	req := &basepb.SetConfigRequest{MsgpackConfig: cfg.PluginConfig, PluginApiVersion: cfg.ApiVersion}
	if cfg.AgentConfig != nil && cfg.AgentConfig.Driver != nil {
		req.NomadConfig = &basepb.NomadConfig{Driver: &basepb.NomadDriverConfig{
			ClientMinPort: uint32(cfg.AgentConfig.Driver.ClientMinPort),
			ClientMaxPort: uint32(cfg.AgentConfig.Driver.ClientMaxPort),
		}}
	}
	_, err := c.Client.SetConfig(c.DoneCtx, req)
	return err
}
