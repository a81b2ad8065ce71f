package config

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestValidateNames: served_model_names and lora_modules are accepted for
// vLLM and the sim, refused elsewhere, and each bad entry is named.
func TestValidateNames(t *testing.T) {
	for _, tc := range []struct {
		name, engine string
		names, loras []string
		err          string
	}{
		{"ok", EngineVLLM, []string{"m3-alias"}, []string{"sql=/a/sql", "chat=org/chat"}, ""},
		{"sim", EngineSim, nil, []string{"sql=/a/sql"}, ""},
		{"other engine", EngineSGLang, nil, []string{"sql=/a/sql"}, "lora_modules: not rendered for engine sglang"},
		{"no path", EngineVLLM, nil, []string{"sql"}, "lora_modules: entry \"sql\": want name=path"},
		{"empty path", EngineVLLM, nil, []string{"sql="}, "want name=path"},
		{"empty name", EngineVLLM, nil, []string{"=/a"}, "lora_modules: an empty name"},
		{"comma", EngineVLLM, []string{"a,b"}, nil, "served_model_names: name \"a,b\" has white space, a comma"},
		{"twice", EngineVLLM, []string{"x"}, []string{"x=/a"}, "lora_modules: name \"x\" is served twice"},
		{"the model's own", EngineVLLM, []string{"m"}, nil, "served twice"},
		{"too long", EngineVLLM, []string{strings.Repeat("n", 257)}, nil, "over 256 bytes"},
		{"too many", EngineVLLM, strings.Split(strings.Repeat("n,", MaxServedNames)+"n", ","), nil, "at most 64 entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := TaskConfig{Engine: tc.engine, Model: "m", Port: "http", KVEvents: new(bool),
				ServedModelNames: tc.names, LoRAModules: tc.loras}
			err := c.Normalize().Validate()
			if tc.err == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, tc.err)
		})
	}
}

// TestValidateLoRALoadable: lora_loadable follows lora_modules' rules, its
// names distinct from theirs, and only for vLLM, the sim and llama.cpp
// (which takes no other list: one alias, adapters applied per request).
func TestValidateLoRALoadable(t *testing.T) {
	c := TaskConfig{Engine: EngineVLLM, Model: "m", Port: "http", KVEvents: new(bool),
		LoRAModules: []string{"x=/a"}, LoRALoadable: []string{"y=/b", "z=org/z"}}
	must.NoError(t, c.Normalize().Validate())
	c.LoRALoadable = []string{"x=/c"}
	must.ErrorContains(t, c.Normalize().Validate(), "lora_loadable: name \"x\" is served twice")
	c.LoRALoadable = []string{"y"}
	must.ErrorContains(t, c.Normalize().Validate(), "lora_loadable: entry \"y\": want name=path")
	c.Engine, c.LoRAModules, c.LoRALoadable = EngineSGLang, nil, []string{"y=/b"}
	must.ErrorContains(t, c.Normalize().Validate(), "lora_loadable: not rendered for engine sglang")

	c.Engine, c.LoRALoadable = EngineLlamaCpp, []string{"sql=/adapters/sql.gguf"}
	must.NoError(t, c.Normalize().Validate())
	c.LoRALoadable = []string{"sql"}
	must.ErrorContains(t, c.Normalize().Validate(), "want name=path (a GGUF LoRA adapter file")
	c.LoRALoadable = []string{"sql=/a,b.gguf"}
	must.ErrorContains(t, c.Normalize().Validate(), "entry \"sql=/a,b.gguf\": want name=path")
	c.LoRALoadable, c.LoRAModules = nil, []string{"sql=/adapters/sql.gguf"}
	must.ErrorContains(t, c.Normalize().Validate(), "lora_modules: not rendered for engine llama_cpp: llama-server applies adapters per request")
	c.LoRAModules, c.ServedModelNames = nil, []string{"alias"}
	must.ErrorContains(t, c.Normalize().Validate(), "served_model_names: not rendered for engine llama_cpp: llama-server serves one name")
}
