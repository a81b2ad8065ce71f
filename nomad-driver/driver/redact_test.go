package driver

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestRedact(t *testing.T) {
	in := []string{"vllm", "serve", "m", "--api-key", "sk-123", "--hf-token=abc", "--port", "8000", "--ssl-keyfile", "/k.pem"}
	must.Eq(t, []string{"vllm", "serve", "m", "--api-key", "<redacted>", "--hf-token=<redacted>", "--port", "8000", "--ssl-keyfile", "<redacted>"}, redact(in))
	must.EqOp(t, "sk-123", in[4], must.Sprint("the argv itself is untouched"))

	for _, tc := range []struct {
		flag   string
		secret bool
	}{
		{"--api-key", true}, {"--api-key-file", true}, {"--hf-token", true}, {"--HF_TOKEN", true},
		{"--ssl-keyfile", true}, {"--client-secret", true}, {"--redis-password", true}, {"--apikey", true},
		{"--max-num-batched-tokens", false}, {"--max_num_tokens", false}, {"--tokenizer", false},
		{"--step-time-per-prefill-token", false}, {"--kv-transfer-config", false}, {"--port", false},
	} {
		got := redact([]string{tc.flag, "v"})[1] == "<redacted>"
		must.EqOp(t, tc.secret, got, must.Sprintf("%s", tc.flag))
	}
}

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		"oasis-sim 0.1.0\n":                      "0.1.0",
		"0.11.0\n":                               "0.11.0",
		"version: 6123 (abc1234)\nbuilt with cc": "6123",
		"1.2.0rc1":                               "1.2.0rc1",
		"no digits":                              "unknown",
	} {
		must.EqOp(t, want, parseVersion(out))
	}
}
