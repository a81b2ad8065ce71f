package config

import (
	"strings"
)

// Bounds on a task's further served names and LoRA adapters.
const (
	MaxServedNames = 64
	maxNameLen     = 256
)

// LoRAModule is one entry of lora_modules: an adapter vLLM serves under
// Name from Path (a local directory or a Hugging Face repository id).
type LoRAModule struct{ Name, Path string }

// ParseLoRAModule reads a lora_modules entry "name=path".
func ParseLoRAModule(s string) (LoRAModule, bool) {
	name, path, ok := strings.Cut(s, "=")
	return LoRAModule{Name: name, Path: path}, ok
}

// namesEngine reports whether engine serves further names and adapters
// through vLLM's flags (--served-model-name a b, --lora-modules).
func namesEngine(engine string) bool { return engine == EngineVLLM || engine == EngineSim }

// llamaLoRAOnly is why llama.cpp takes lora_loadable and neither of the
// other lists: llama-server serves one alias (-a, served_model_name) and
// loads every adapter at start (--lora PATH), applying them per request as
// the router asks, so its adapters are the loadable kind.
var llamaLoRAOnly = map[string]string{
	"served_model_names": "llama-server serves one name (-a, from served_model_name)",
	"lora_modules":       "llama-server applies adapters per request: list them in lora_loadable (name=path of a GGUF adapter; the router applies one by name)",
}

// validateNames checks served_model_names and lora_modules: only where the
// engine renders them; names non-empty, without white space, commas or
// control characters (they become comma-separated service meta), at most
// maxNameLen bytes, none twice across served_model_name and both lists;
// paths non-empty without white space or commas.
func (c TaskConfig) validateNames() []error {
	var errs []error
	if c.Engine == EngineLlamaCpp {
		for _, f := range []struct {
			name string
			set  bool
		}{{"served_model_names", len(c.ServedModelNames) > 0}, {"lora_modules", len(c.LoRAModules) > 0}} {
			if f.set {
				errs = append(errs, fieldErr(f.name, "not rendered for engine %s: %s", c.Engine, llamaLoRAOnly[f.name]))
			}
		}
	} else if !namesEngine(c.Engine) {
		for _, f := range []struct {
			name string
			set  bool
		}{{"served_model_names", len(c.ServedModelNames) > 0}, {"lora_modules", len(c.LoRAModules) > 0},
			{"lora_loadable", len(c.LoRALoadable) > 0}} {
			if f.set {
				errs = append(errs, fieldErr(f.name, "not rendered for engine %s; allowed for: vllm, sim (lora_loadable also llama.cpp)", c.Engine))
			}
		}
		return errs
	}
	seen := map[string]bool{c.ServedModelName: true}
	check := func(field, name string) {
		switch {
		case name == "":
			errs = append(errs, fieldErr(field, "an empty name"))
		case len(name) > maxNameLen:
			errs = append(errs, fieldErr(field, "name %.32q… is over %d bytes", name, maxNameLen))
		case strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == ',' || r == 0x7f }):
			errs = append(errs, fieldErr(field, "name %q has white space, a comma or a control character", name))
		case seen[name]:
			errs = append(errs, fieldErr(field, "name %q is served twice (or is served_model_name)", name))
		}
		seen[name] = true
	}
	for i, lists := range [][]string{c.ServedModelNames, c.LoRAModules, c.LoRALoadable} {
		field := []string{"served_model_names", "lora_modules", "lora_loadable"}[i]
		if len(lists) > MaxServedNames {
			errs = append(errs, fieldErr(field, "at most %d entries, got %d", MaxServedNames, len(lists)))
			continue
		}
		for _, s := range lists {
			if i == 0 {
				check(field, s)
				continue
			}
			m, ok := ParseLoRAModule(s)
			// No commas: the entries become comma-separated service meta (and llama-server splits --lora on them).
			if !ok || m.Path == "" || strings.ContainsFunc(m.Path, func(r rune) bool { return r <= ' ' || r == ',' }) {
				want := "a directory or a Hugging Face repository id"
				if c.Engine == EngineLlamaCpp {
					want = "a GGUF LoRA adapter file on the node, as llama-server's --lora takes it"
				}
				errs = append(errs, fieldErr(field, "entry %q: want name=path (%s)", s, want))
				continue
			}
			check(field, m.Name)
		}
	}
	return errs
}
