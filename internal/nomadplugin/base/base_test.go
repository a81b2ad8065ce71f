package base

import (
	"testing"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/protobuf/proto"

	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

type fakePlugin struct {
	kind string
	got  *Config
}

var fakeSpec = hclspec.NewObject(map[string]*hclspec.Spec{"a": hclspec.NewAttr("a", "string", true)})

func (f *fakePlugin) PluginInfo() (*PluginInfoResponse, error) {
	return &PluginInfoResponse{Type: f.kind, PluginApiVersions: []string{"v0.1.0"}, PluginVersion: "1.2.3", Name: "fake"}, nil
}
func (f *fakePlugin) ConfigSchema() (*hclspec.Spec, error) { return fakeSpec, nil }
func (f *fakePlugin) SetConfig(c *Config) error            { f.got = c; return nil }

func dispense(t *testing.T, impl BasePlugin) BasePlugin {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, true, map[string]plugin.Plugin{PluginTypeBase: &PluginBase{Impl: impl}})
	t.Cleanup(func() { client.Close(); server.Stop() })
	raw, err := client.Dispense(PluginTypeBase)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(BasePlugin)
}

func TestBaseServiceRoundTrip(t *testing.T) {
	for _, kind := range []string{PluginTypeDriver, PluginTypeDevice} {
		t.Run(kind, func(t *testing.T) {
			impl := &fakePlugin{kind: kind}
			c := dispense(t, impl)
			info, err := c.PluginInfo()
			if err != nil || info.Type != kind || info.Name != "fake" || info.PluginVersion != "1.2.3" || info.PluginApiVersions[0] != "v0.1.0" {
				t.Fatalf("info %+v, %v", info, err)
			}
			spec, err := c.ConfigSchema()
			if err != nil || !proto.Equal(spec, fakeSpec) {
				t.Fatalf("schema %v, %v", spec, err)
			}
			var buf []byte
			if err := MsgPackEncode(&buf, map[string]string{"a": "b"}); err != nil {
				t.Fatal(err)
			}
			err = c.SetConfig(&Config{PluginConfig: buf, ApiVersion: "v0.1.0",
				AgentConfig: &AgentConfig{Driver: &ClientDriverConfig{ClientMinPort: 20000, ClientMaxPort: 32000}}})
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]string
			if err := MsgPackDecode(impl.got.PluginConfig, &got); err != nil || got["a"] != "b" {
				t.Fatalf("config %v, %v", got, err)
			}
			// Only task drivers get the agent's driver settings.
			if d := impl.got.AgentConfig.Driver; (kind == PluginTypeDriver) != (d != nil) {
				t.Fatalf("%s got driver config %+v", kind, d)
			}
		})
	}
}

func TestUnknownPluginTypeIsAnError(t *testing.T) {
	if _, err := dispense(t, &fakePlugin{kind: "widget"}).PluginInfo(); err == nil {
		t.Fatal("PluginInfo of an unknown type must fail")
	}
}
