package discovery

import (
	"strconv"

	"github.com/oasis-llm/oasis/router/worker"
)

// Roles (oasis_role) and prefill/decode protocols (oasis_pd_protocol).
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"

	ProtocolVLLM   = "vllm"
	ProtocolSGLang = "sglang"
)

// MetaError is a service meta value the pool refuses: the instance is left
// out of the pool (logged once per instance and value, counted in
// oasis_router_meta_rejected_total{key}).
type MetaError struct {
	Key, Value string
	Reason     string
}

func (e *MetaError) Error() string {
	return "service meta " + e.Key + "=" + strconv.Quote(e.Value) + ": " + e.Reason
}

// checkDisagg validates the meta that decides how the router pairs w with
// others for disaggregated prefill/decode. Meta is written by whoever
// registers the service: a value the router would misread refuses the
// instance instead of sending it requests it cannot serve.
func checkDisagg(w *worker.Worker, get func(string) string) error {
	switch w.Role {
	case RoleBoth, RolePrefill, RoleDecode:
	default:
		return &MetaError{Key: MetaRole, Value: w.Role, Reason: "want both, prefill or decode"}
	}
	switch w.PDProtocol {
	case ProtocolVLLM, ProtocolSGLang:
	default:
		return &MetaError{Key: MetaPDProtocol, Value: w.PDProtocol, Reason: "want vllm or sglang"}
	}
	v := get(MetaBootstrapPort)
	if v != "" {
		if n, err := strconv.Atoi(v); err != nil || n < 1 || n > 65535 {
			return &MetaError{Key: MetaBootstrapPort, Value: v, Reason: "want a port number 1-65535"}
		}
	}
	if v == "" && w.Role == RolePrefill && w.PDProtocol == ProtocolSGLang {
		return &MetaError{Key: MetaBootstrapPort, Reason: "an SGLang prefill instance must advertise its bootstrap port"}
	}
	return nil
}
