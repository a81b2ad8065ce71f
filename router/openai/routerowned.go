package openai

import "bytes"

// The members of a request body that belong to the router's disaggregated
// prefill/decode protocol (router/gateway pd_vllm.go, pd_sglang.go): the
// router writes them into the legs it sends a prefill/decode pair. From a
// client they would let it steer engines' KV transfers (a NixlConnector
// decode engine pulls the blocks kv_transfer_params names, from the host it
// names; an SGLang decode engine joins the bootstrap room named), so the
// gateway removes them from every client body. SGLang's other transfer
// fields (bootstrap_pair_key, disagg_prefill_dp_rank, decode_tp_size),
// which the router does not set, steer a transfer the same way and go too.
const (
	keyKVTransferParams = "kv_transfer_params"
	keyBootstrapHost    = "bootstrap_host"
	keyBootstrapPort    = "bootstrap_port"
	keyBootstrapRoom    = "bootstrap_room"
	keyBootstrapPairKey = "bootstrap_pair_key"
	keyPrefillDPRank    = "disagg_prefill_dp_rank"
	keyDecodeTPSize     = "decode_tp_size"
)

// RouterOwned reports whether key (a top-level member's, unescaped) is one
// of the router's disaggregation protocol.
func RouterOwned(key string) bool {
	switch key {
	case keyKVTransferParams, keyBootstrapHost, keyBootstrapPort, keyBootstrapRoom,
		keyBootstrapPairKey, keyPrefillDPRank, keyDecodeTPSize:
		return true
	}
	return false
}

// WithoutRouterOwned returns body, a JSON object, without its top-level
// members RouterOwned names (every one of a repeated key). The members kept
// are copied byte for byte, in their order, joined by commas (the
// whitespace between members is dropped); a body without such a member is
// returned as it is. It fails with ErrMalformedJSON or ErrNotObject as
// ParseRequest would.
func WithoutRouterOwned(body []byte) ([]byte, error) {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		if valid, _ := scanRequest(body, &rawFields{}); !valid {
			return nil, malformed(body)
		}
		return nil, ErrNotObject
	}
	out := make([]byte, 0, len(body))
	out = append(out, body[:i+1]...)
	kept, dropped := 0, 0
	i = skipWS(body, i+1)
	if i < len(body) && body[i] == '}' {
		if skipWS(body, i+1) != len(body) {
			return nil, malformed(body)
		}
		return body, nil
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return nil, malformed(body)
		}
		ks := i
		ke, ok := scanString(body, i)
		if !ok {
			return nil, malformed(body)
		}
		j := skipWS(body, ke)
		if j >= len(body) || body[j] != ':' {
			return nil, malformed(body)
		}
		ve, ok := scanValue(body, skipWS(body, j+1), 1)
		if !ok {
			return nil, malformed(body)
		}
		key := body[ks+1 : ke-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			s, _ := jsonString(body[ks:ke])
			key = []byte(s)
		}
		if RouterOwned(string(key)) {
			dropped++
		} else {
			if kept > 0 {
				out = append(out, ',')
			}
			out = append(out, body[ks:ve]...)
			kept++
		}
		next, more, ok := afterElement(body, ve, '}')
		if !ok {
			return nil, malformed(body)
		}
		if !more {
			if skipWS(body, next) != len(body) {
				return nil, malformed(body)
			}
			if dropped == 0 {
				return body, nil
			}
			return append(append(out, '}'), body[next:]...), nil
		}
		i = next
	}
}
