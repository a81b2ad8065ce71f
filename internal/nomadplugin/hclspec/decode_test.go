package hclspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-msgpack/codec"
	"github.com/zclconf/go-cty/cty"
)

var testSpec = NewObject(map[string]*Spec{
	"engine":  NewAttr("engine", "string", true),
	"args":    NewAttr("args", "list(string)", false),
	"port":    NewDefault(NewAttr("port", "number", false), NewLiteral("8000")),
	"enabled": NewDefault(NewAttr("enabled", "bool", false), NewLiteral("false")),
	"env":     NewBlockAttrs("env", "string", false),
	"tier": NewBlockList("tier", NewObject(map[string]*Spec{
		"name": NewAttr("name", "string", true),
		"size": NewAttr("size", "string", false),
	})),
	"auth": NewBlock("auth", false, NewObject(map[string]*Spec{
		"username": NewAttr("username", "string", false),
	})),
})

type testConfig struct {
	Engine  string            `codec:"engine"`
	Args    []string          `codec:"args"`
	Port    int               `codec:"port"`
	Enabled bool              `codec:"enabled"`
	Env     map[string]string `codec:"env"`
	Tier    []struct {
		Name string `codec:"name"`
		Size string `codec:"size"`
	} `codec:"tier"`
	Auth *struct {
		Username string `codec:"username"`
	} `codec:"auth"`
}

func decodeInto(t *testing.T, buf []byte, out any) {
	t.Helper()
	h := &codec.MsgpackHandle{}
	h.RawToString = true
	h.TypeInfos = codec.NewTypeInfos([]string{"codec"})
	if err := codec.NewDecoderBytes(buf, h).Decode(out); err != nil {
		t.Fatalf("decoding msgpack: %v", err)
	}
}

func TestEncodeAsNomadsClientDoes(t *testing.T) {
	buf, err := Encode(testSpec, map[string]any{
		"engine": "vllm",
		"args":   []any{"--a", "--b"},
		"env":    []any{map[string]any{"HF_HOME": "/x"}},
		"tier":   []any{map[string]any{"name": "ram", "size": "1GiB"}, map[string]any{"name": "ssd"}},
		"auth":   []any{map[string]any{"username": "u"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got testConfig
	decodeInto(t, buf, &got)
	if got.Engine != "vllm" || got.Port != 8000 || got.Enabled || len(got.Args) != 2 || got.Env["HF_HOME"] != "/x" {
		t.Fatalf("decoded %+v", got)
	}
	if len(got.Tier) != 2 || got.Tier[1].Name != "ssd" || got.Auth == nil || got.Auth.Username != "u" {
		t.Fatalf("decoded blocks %+v", got)
	}
}

func TestDecodeErrorsNameTheAttribute(t *testing.T) {
	tests := []struct {
		name   string
		config map[string]any
		want   string
	}{
		{"missing required", map[string]any{}, "engine"},
		{"wrong type", map[string]any{"engine": "x", "port": "eighty"}, "port"},
		{"unknown attribute", map[string]any{"engine": "x", "bogus": 1}, "bogus"},
		{"nested required", map[string]any{"engine": "x", "tier": []any{map[string]any{"size": "1"}}}, "name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(testSpec, tc.config)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestConvertRejectsInvalidSpecs(t *testing.T) {
	tests := map[string]*Spec{
		"bad type":       NewObject(map[string]*Spec{"a": NewAttr("a", "lisst(string)", false)}),
		"bad literal":    NewDefault(NewAttr("a", "string", false), NewLiteral(`"unterminated`)),
		"block no inner": NewBlock("b", false, nil),
		"empty":          {},
	}
	for name, spec := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := Convert(spec); !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("got %v, want ErrInvalidSpec", err)
			}
		})
	}
}

func TestAttrNameFromObject(t *testing.T) {
	spec := NewObject(map[string]*Spec{"implied": NewAttr("", "string", false)})
	v, err := Decode(spec, map[string]any{"implied": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	if got := v.GetAttr("implied"); !got.RawEquals(cty.StringVal("yes")) {
		t.Fatalf("got %#v", got)
	}
}
