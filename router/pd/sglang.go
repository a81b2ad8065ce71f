package pd

import (
	"encoding/json"
	"math/rand/v2"
	"net"
	"strconv"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// The SGLang protocol, as SGLang's own load balancers run it
// (sgl-project/sglang python/sglang/srt/disaggregation/mini_lb.py, and
// sgl-router's PD router, sgl-router/src/routers/http/pd_router.rs): both
// legs are the client's body plus bootstrap_host (the prefill instance's
// host), bootstrap_port (its bootstrap server, oasis_bootstrap_port) and
// bootstrap_room (a random 63-bit integer naming the transfer), sent at
// once; the decode engine pulls the KV from the prefill engine's bootstrap
// server. The decode leg's answer is the client's; the prefill leg's is
// read to its end and dropped.

// SGLangBody is both legs' body for the client's body and prefill worker pw.
func SGLangBody(body []byte, pw *scoring.Worker) ([]byte, error) {
	host, _, err := net.SplitHostPort(pw.Address)
	if err != nil {
		return nil, err
	}
	return openai.WithFields(body, map[string]json.RawMessage{
		"bootstrap_host": openai.String(host),
		"bootstrap_port": json.RawMessage(strconv.Itoa(pw.BootstrapPort)),
		"bootstrap_room": json.RawMessage(strconv.FormatInt(rand.Int64(), 10)), // [0, 2⁶³)
	})
}
