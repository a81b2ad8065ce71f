// Package base is the part of Nomad's plugin protocol every plugin serves:
// the go-plugin handshake, the BasePlugin service (what the plugin is, its
// configuration schema, its configuration) and the msgpack encoding Nomad
// uses for configurations and driver state.
//
// Oasis speaks the protocol itself rather than linking Nomad's plugin SDK:
// the github.com/hashicorp/nomad module is not under an open-source licence
// from v1.7.0 on. The declarations in ../proto are written for Oasis and
// wire-compatible with protocol v0.1.0, which Nomad's agents speak.
package base

import (
	"bytes"
	"reflect"

	"github.com/hashicorp/go-msgpack/codec"
	plugin "github.com/hashicorp/go-plugin"

	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

// Plugin kinds, as go-plugin names them in a plugin set and as PluginInfo
// reports them.
const (
	PluginTypeBase   = "base"
	PluginTypeDriver = "driver"
	PluginTypeDevice = "device"
)

// Handshake is the go-plugin handshake Nomad's agents expect of a plugin
// binary: protocol 2 (gRPC) and Nomad's magic cookie, which tells a binary
// started by hand that it is not being run by Nomad.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  2,
	MagicCookieKey:   "NOMAD_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "e4327c2e01eabfd75a8a67adb114fb34a757d57eee7728d857a8cec6e91a7255",
}

// PluginInfoResponse says what a plugin is.
type PluginInfoResponse struct {
	// Type is PluginTypeDriver or PluginTypeDevice.
	Type string
	// PluginApiVersions are the protocol versions the plugin speaks
	// ("v0.1.0").
	PluginApiVersions []string
	// PluginVersion is the plugin's own version.
	PluginVersion string
	// Name is the plugin's name in the agent's configuration.
	Name string
}

// Config is what SetConfig hands a plugin.
type Config struct {
	// PluginConfig is the plugin's configuration block, decoded against
	// its ConfigSchema and encoded as cty msgpack: decode it with
	// MsgPackDecode into a struct with `codec` tags.
	PluginConfig []byte
	// AgentConfig is the part of the agent's configuration a plugin may
	// need; nil fields were not sent.
	AgentConfig *AgentConfig
	// ApiVersion is the protocol version the agent chose.
	ApiVersion string
}

// AgentConfig is the part of the Nomad agent's configuration sent to
// plugins. Only task drivers receive Driver.
type AgentConfig struct {
	Driver *ClientDriverConfig
}

// ClientDriverConfig is the client's dynamic port range.
type ClientDriverConfig struct {
	ClientMinPort uint
	ClientMaxPort uint
}

// BasePlugin is what every plugin implements.
type BasePlugin interface {
	PluginInfo() (*PluginInfoResponse, error)
	ConfigSchema() (*hclspec.Spec, error)
	SetConfig(*Config) error
}

// msgpackHandle encodes and decodes as Nomad's agents do: strings as raw
// strings, maps into map[string]any, only `codec` struct tags.
func msgpackHandle() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{}
	h.RawToString = true
	h.BasicHandle.TimeNotBuiltin = true
	h.MapType = reflect.TypeOf(map[string]any(nil))
	h.TypeInfos = codec.NewTypeInfos([]string{"codec"})
	return h
}

// MsgPackDecode decodes msgpack (a plugin or task configuration, a driver
// state) into out.
func MsgPackDecode(buf []byte, out any) error {
	return codec.NewDecoder(bytes.NewReader(buf), msgpackHandle()).Decode(out)
}

// MsgPackEncode encodes in as msgpack into *b.
func MsgPackEncode(b *[]byte, in any) error {
	return codec.NewEncoderBytes(b, msgpackHandle()).Encode(in)
}
