package provider

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestEmbeddedJobsDeclareTheirVariables(t *testing.T) {
	files, err := embeddedJobs()
	must.NoError(t, err)
	for _, name := range []string{"region", "datacenters", "oasis_bin_dir", "consul_addr"} {
		must.MapContainsKey(t, files["router_variables"].Vars, name)
		must.MapContainsKey(t, files["kvcached_variables"].Vars, name)
	}
	must.MapContainsKey(t, files["router_variables"].Vars, "api_keys_kv")
	must.MapContainsKey(t, files["kvcached_variables"].Vars, "resp_port")
}

func TestSystemJobVariables(t *testing.T) {
	files, err := embeddedJobs()
	must.NoError(t, err)
	router := files["router_variables"]
	text, errs := router.jobVariables("east", []string{"dc1"}, map[string]string{
		"http_port":         "8080",
		"api_keys_kv":       "true",
		"oasis_bin_dir":     "/opt/oasis ${x}",
		"hosted_upstreams":  `["https://api.example.com/v1", "https://*.openai.azure.com/openai"]`,
		"federation_models": "[]",
	})
	must.SliceEmpty(t, errs)
	must.EqOp(t, `region = "east"
datacenters = ["dc1"]
api_keys_kv = true
federation_models = []
hosted_upstreams = ["https://api.example.com/v1", "https://*.openai.azure.com/openai"]
http_port = 8080
oasis_bin_dir = "/opt/oasis $${x}"`, text)
}

func TestSystemJobVariablesErrors(t *testing.T) {
	files, err := embeddedJobs()
	must.NoError(t, err)
	for _, tc := range []struct {
		vars     map[string]string
		name     string
		contains string
	}{
		{map[string]string{"htp_port": "1"}, "htp_port", "declares no variable \"htp_port\""},
		{map[string]string{"http_port": "eighty"}, "http_port", "not a number"},
		{map[string]string{"api_keys_kv": "yes"}, "api_keys_kv", "not a bool"},
		{map[string]string{"hosted_upstreams": "https://a"}, "hosted_upstreams", "list of string"},
		{map[string]string{"region": "west"}, "region", "region attribute"},
		{map[string]string{"datacenters": `["a"]`}, "datacenters", "datacenters attribute"},
	} {
		_, errs := files["router_variables"].assignments(tc.vars)
		must.Len(t, 1, errs)
		must.EqOp(t, tc.name, errs[0].Name)
		must.True(t, strings.Contains(errs[0].Msg, tc.contains), must.Sprintf("%q lacks %q", errs[0].Msg, tc.contains))
	}
}

func TestSubmissionHash(t *testing.T) {
	must.EqOp(t, submissionHash("a", "b"), submissionHash("a", "b"))
	must.NotEqOp(t, submissionHash("a", "b"), submissionHash("a", "c"))
	must.NotEqOp(t, submissionHash("a", "b"), submissionHash("ab", ""))
}
