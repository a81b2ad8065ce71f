package driver

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestRedact(t *testing.T) {
	in := []string{"vllm", "serve", "m", "--api-key", "sk-123", "--hf-token=abc", "--port", "8000", "--ssl-keyfile", "/k.pem"}
	must.Eq(t, []string{"vllm", "serve", "m", "--api-key", "<redacted>", "--hf-token=<redacted>", "--port", "8000", "--ssl-keyfile", "<redacted>"}, redact(in))
	must.EqOp(t, "sk-123", in[4], must.Sprint("the argv itself is untouched"))
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
