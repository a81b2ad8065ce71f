package server

// LoRA adapters loaded at run time, as vLLM serves them with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING (vllm/entrypoints/openai/serving_models.py):
// POST /v1/load_lora_adapter {"lora_name","lora_path"} and
// POST /v1/unload_lora_adapter {"lora_name"}, with vLLM's answers. A loaded
// adapter is served like one from --lora-modules.

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
)

// maxRuntimeLoRAs bounds the adapters loaded at run time.
const maxRuntimeLoRAs = 1024

// runtimeLoRAs are the adapters loaded at run time: name → path.
type runtimeLoRAs struct {
	mu sync.RWMutex
	m  map[string]string
}

func (r *runtimeLoRAs) path(name string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p, ok := r.m[name]
	return p, ok
}

func (r *runtimeLoRAs) list() []LoRAModule {
	r.mu.RLock()
	out := make([]LoRAModule, 0, len(r.m))
	for n, p := range r.m {
		out = append(out, LoRAModule{Name: n, Path: p})
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	if req.Name == "" || req.Path == "" {
		writeAPIError(w, badRequest(nil, "Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	s.loras.mu.Lock()
	_, dup := s.loras.m[req.Name]
	full := len(s.loras.m) >= maxRuntimeLoRAs
	if !dup && !full && !s.served[req.Name] {
		if s.loras.m == nil {
			s.loras.m = map[string]string{}
		}
		s.loras.m[req.Name] = req.Path
	}
	s.loras.mu.Unlock()
	switch {
	case dup || s.served[req.Name]: // --lora-modules names are served too
		writeAPIError(w, badRequest(nil, "The lora adapter '%s' has already been loaded.", req.Name))
	case full:
		writeAPIError(w, badRequest(nil, "oasis-sim holds at most %d runtime LoRA adapters", maxRuntimeLoRAs))
	default:
		fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
	}
}

func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	s.loras.mu.Lock()
	_, ok := s.loras.m[req.Name]
	delete(s.loras.m, req.Name)
	s.loras.mu.Unlock()
	if !ok {
		writeAPIError(w, &apiError{status: http.StatusNotFound, typ: "NotFoundError",
			msg: fmt.Sprintf("The lora adapter '%s' cannot be found.", req.Name)})
		return
	}
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}
