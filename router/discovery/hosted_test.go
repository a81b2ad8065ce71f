package discovery

import (
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/metrics"
)

func TestHostedPolicyAllow(t *testing.T) {
	hp, err := ParseHostedPolicy(
		[]string{"https://api.openai.com/v1", "https://*.openai.azure.com/openai", "http://127.0.0.1:9999/v1",
			"https://api.example.com:8443/", "https://[::1]:7000/v1"},
		[]string{"OPENAI_KEY=https://api.openai.com/v1", "AZURE_KEY=https://*.openai.azure.com", "ANY_KEY"})
	must.NoError(t, err)
	cases := []struct {
		name, upstream, keyEnv string
		want                   error
	}{
		{"local engine", "", "", nil},
		{"exact base URL", "https://api.openai.com/v1", "", nil},
		{"trailing slash", "https://api.openai.com/v1/", "", nil},
		{"host is case-insensitive", "https://API.OpenAI.com/v1", "", nil},
		{"explicit default port", "https://api.openai.com:443/v1", "", nil},
		{"path below the entry", "https://api.openai.com/v1/org", "", nil},
		{"path sharing a prefix, not a segment", "https://api.openai.com/v1beta", "", ErrUpstreamNotAllowed},
		{"path above the entry", "https://api.openai.com/", "", ErrUpstreamNotAllowed},
		{"other host", "https://evil.example/v1", "", ErrUpstreamNotAllowed},
		{"host suffix is not the host", "https://api.openai.com.evil.example/v1", "", ErrUpstreamNotAllowed},
		{"other port", "https://api.openai.com:8443/v1", "", ErrUpstreamNotAllowed},
		{"http to an allowed https host", "http://api.openai.com/v1", "", ErrUpstreamInvalid},
		{"wildcard one label", "https://myres.openai.azure.com/openai/deployments/gpt", "", nil},
		{"wildcard two labels", "https://a.b.openai.azure.com/openai", "", ErrUpstreamNotAllowed},
		{"wildcard bare domain", "https://openai.azure.com/openai", "", ErrUpstreamNotAllowed},
		{"wildcard other path", "https://myres.openai.azure.com/v1", "", ErrUpstreamNotAllowed},
		{"entry with root path allows every path", "https://api.example.com:8443/anything", "", nil},
		{"http on loopback", "http://127.0.0.1:9999/v1", "", nil},
		{"http on loopback, other port", "http://127.0.0.1:9998/v1", "", ErrUpstreamNotAllowed},
		{"IPv6 loopback", "https://[::1]:7000/v1", "", nil},
		{"http beyond loopback", "http://10.0.0.1/v1", "", ErrUpstreamInvalid},
		{"dot segments", "https://api.openai.com/v1/../admin", "", ErrUpstreamInvalid},
		{"escaped dot segments", "https://api.openai.com/v1/%2e%2e/admin", "", ErrUpstreamInvalid},
		{"user info", "https://user@api.openai.com/v1", "", ErrUpstreamInvalid},
		{"query", "https://api.openai.com/v1?x=1", "", ErrUpstreamInvalid},
		{"fragment", "https://api.openai.com/v1#x", "", ErrUpstreamInvalid},
		{"other scheme", "ftp://api.openai.com/v1", "", ErrUpstreamInvalid},
		{"not a URL", "://", "", ErrUpstreamInvalid},
		{"relative", "api.openai.com/v1", "", ErrUpstreamInvalid},
		{"control character", "https://api.openai.com/v1\n", "", ErrUpstreamInvalid},
		{"bound key on its upstream", "https://api.openai.com/v1", "OPENAI_KEY", nil},
		{"bound key on another allowed upstream", "https://x.openai.azure.com/openai", "OPENAI_KEY", ErrKeyEnvNotAllowed},
		{"wildcard-bound key", "https://x.openai.azure.com/openai", "AZURE_KEY", nil},
		{"unbound key on any allowed upstream", "http://127.0.0.1:9999/v1", "ANY_KEY", nil},
		{"key not listed", "https://api.openai.com/v1", "AWS_SECRET_ACCESS_KEY", ErrKeyEnvNotAllowed},
		{"key without upstream", "", "ANY_KEY", ErrKeyEnvWithoutUpstream},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := hp.Allow(tc.upstream, tc.keyEnv)
			if tc.want == nil {
				must.NoError(t, err)
				return
			}
			must.ErrorIs(t, err, tc.want)
			var he *HostedError
			must.True(t, errors.As(err, &he))
			must.Eq(t, tc.upstream, he.Upstream)
			must.NotEq(t, "other", he.Reason())
		})
	}
}

func TestHostedPolicyEmptyAllowsNone(t *testing.T) {
	var nilPolicy *HostedPolicy
	empty, err := ParseHostedPolicy(nil, nil)
	must.NoError(t, err)
	for _, hp := range []*HostedPolicy{nilPolicy, empty, {}} {
		must.True(t, hp.Empty())
		must.NoError(t, hp.Allow("", ""))
		must.ErrorIs(t, hp.Allow("https://api.openai.com/v1", ""), ErrUpstreamNotAllowed)
		must.ErrorIs(t, hp.Allow("http://127.0.0.1:1/v1", "HOME"), ErrUpstreamNotAllowed)
	}
}

func TestParseHostedPolicyRejects(t *testing.T) {
	cases := []struct {
		name              string
		upstreams, keyEnv []string
		wantIn            string
	}{
		{"http beyond loopback", []string{"http://api.openai.com/v1"}, nil, "https"},
		{"no scheme", []string{"api.openai.com/v1"}, nil, "scheme"},
		{"wildcard top-level domain", []string{"https://*.com/v1"}, nil, "two labels"},
		{"bare wildcard", []string{"https://*/v1"}, nil, "bad host"},
		{"wildcard inside a label", []string{"https://api*.openai.com/v1"}, nil, "bad host"},
		{"wildcard not leftmost", []string{"https://api.*.com/v1"}, nil, "bad host"},
		{"wildcard over http", []string{"http://*.localhost.test/v1"}, nil, "https"},
		{"wildcard over a public suffix", []string{"https://*.co.uk/v1"}, nil, `public suffix "co.uk"`},
		{"wildcard over a private public suffix", []string{"https://*.github.io/v1"}, nil, `public suffix "github.io"`},
		{"wildcard over a hosting suffix", []string{"https://*.azurewebsites.net"}, nil, `public suffix "azurewebsites.net"`},
		{"wildcard over a wildcard suffix", []string{"https://*.foo.ck/v1"}, nil, `public suffix "foo.ck"`},
		{"wildcard over an address", []string{"https://*.10.0.0.1/v1"}, nil, "address"},
		{"key bound to a public-suffix wildcard", nil, []string{"KEY=https://*.com.au"}, "KEY"},
		{"query", []string{"https://api.openai.com/v1?a=b"}, nil, "query"},
		{"user", []string{"https://u:p@api.openai.com/v1"}, nil, "user"},
		{"dot segment", []string{"https://api.openai.com/v1/.."}, nil, "clean"},
		{"empty host", []string{"https:///v1"}, nil, "bad host"},
		{"key name with a space", nil, []string{"MY KEY"}, "variable name"},
		{"key name starting with a digit", nil, []string{"1KEY"}, "variable name"},
		{"empty key name", nil, []string{"=https://api.openai.com/v1"}, "variable name"},
		{"key bound to a bad pattern", nil, []string{"KEY=http://api.openai.com/v1"}, "KEY"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseHostedPolicy(tc.upstreams, tc.keyEnv)
			must.ErrorIs(t, err, ErrBadPattern)
			must.StrContains(t, err.Error(), tc.wantIn)
		})
	}
}

func TestSplitList(t *testing.T) {
	must.Eq(t, []string{"a", "b c", "d"}, SplitList(" a, b c ,,d,"))
	must.Nil(t, SplitList(""))
}

// A registration's meta is untrusted: without the operator's allow-list a
// hosted upstream never enters the pool, whatever variable it names; the
// refusal is logged and counted once per instance and value, not on every
// update.
func TestPoolRefusesHostedUpstreams(t *testing.T) {
	t.Setenv("OASIS_TEST_POOL_SECRET", "sk-secret")
	hosted := func(id, upstream, keyEnv string) Instance {
		return Instance{ID: id, Address: "127.0.0.1:1", Meta: map[string]string{MetaModel: "m",
			MetaUpstream: upstream, MetaUpstreamKeyEnv: keyEnv}}
	}
	local := Instance{ID: "local", Address: "127.0.0.1:2", Meta: map[string]string{MetaModel: "m"}}
	evil := hosted("evil", "https://evil.example/v1", "OASIS_TEST_POOL_SECRET")
	viaTag := Instance{ID: "tagged", Address: "127.0.0.1:3", Tags: []string{"oasis_model=m",
		"oasis_upstream=https://evil.example/v1"}}
	keyOnly := Instance{ID: "key-only", Address: "127.0.0.1:4", Meta: map[string]string{MetaModel: "m",
		MetaUpstreamKeyEnv: "OASIS_TEST_POOL_SECRET"}}

	var logs strings.Builder
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	p := New(Config{Metrics: m, Logger: hclog.New(&hclog.LoggerOptions{Output: &logs})})
	for range 3 {
		p.Set([]Instance{local, evil, viaTag, keyOnly})
	}
	ws := p.Workers("m")
	must.Eq(t, 1, len(ws))
	must.Eq(t, "local", ws[0].ID)
	must.Eq(t, 2, strings.Count(logs.String(), "upstream=https://evil.example/v1"))
	must.False(t, strings.Contains(logs.String(), "sk-secret"))
	must.Eq(t, 2.0, counterValue(t, m.HostedRejected.WithLabelValues("upstream_not_allowed")))
	must.Eq(t, 1.0, counterValue(t, m.HostedRejected.WithLabelValues("key_env_without_upstream")))

	// A changed value is reported again.
	p.Set([]Instance{local, hosted("evil", "https://evil.example/v2", "")})
	must.Eq(t, 3.0, counterValue(t, m.HostedRejected.WithLabelValues("upstream_not_allowed")))

	// Allowed by the operator: used, with the key from the router's environment.
	hp, err := ParseHostedPolicy([]string{"https://evil.example/v1"}, []string{"OASIS_TEST_POOL_SECRET"})
	must.NoError(t, err)
	p = New(Config{Hosted: hp})
	p.Set([]Instance{local, evil})
	ws = p.Workers("m")
	must.Eq(t, 2, len(ws))
	must.Eq(t, "evil", ws[0].ID)
	must.Eq(t, "https://evil.example/v1", ws[0].Upstream)
	must.Eq(t, "sk-secret", ws[0].UpstreamKey)
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	must.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// Registrations are untrusted input: Allow never panics, and what it allows
// is an https (or loopback http) URL matching an entry.
func FuzzHostedPolicyAllow(f *testing.F) {
	for _, s := range []string{"https://api.openai.com/v1", "https://x.openai.azure.com/openai/d", "http://127.0.0.1:9/v1",
		"https://api.openai.com/v1/../x", "https://[::1]:7000/v1", "https://u@h/", "://", "https://%zz", "https://a..b/v1"} {
		f.Add(s, "OPENAI_KEY")
	}
	hp, err := ParseHostedPolicy([]string{"https://api.openai.com/v1", "https://*.openai.azure.com/openai", "http://127.0.0.1:9/v1"},
		[]string{"OPENAI_KEY=https://api.openai.com/v1", "ANY"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, upstream, keyEnv string) {
		err := hp.Allow(upstream, keyEnv)
		if err != nil {
			var he *HostedError
			if !errors.As(err, &he) || he.Reason() == "other" {
				t.Fatalf("untyped refusal %v", err)
			}
			return
		}
		if upstream == "" {
			if keyEnv != "" {
				t.Fatalf("key %q allowed without an upstream", keyEnv)
			}
			return
		}
		u, perr := parseUpstream(upstream)
		if perr != nil || !matchAny(hp.upstreams, u) {
			t.Fatalf("allowed %q that does not parse or match: %v", upstream, perr)
		}
		if u.scheme == "http" && !loopbackHost(u.host) {
			t.Fatalf("allowed plain http beyond loopback: %q", upstream)
		}
	})
}

// Allow-list entries come from flags: a bad one is an error, never a panic,
// and an entry that parses allows its own URL.
func FuzzParseHostedPolicy(f *testing.F) {
	for _, s := range []string{"https://api.openai.com/v1", "https://*.openai.azure.com/openai", "http://127.0.0.1:9/v1",
		"https://*.com", "https://*:80", "KEY=https://a.b/c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		if _, err := ParseHostedPolicy(nil, []string{entry}); err != nil && !errors.Is(err, ErrBadPattern) {
			t.Fatalf("untyped error %v", err)
		}
		hp, err := ParseHostedPolicy([]string{entry}, nil)
		if err != nil {
			if !errors.Is(err, ErrBadPattern) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if !strings.Contains(entry, "*") {
			if err := hp.Allow(strings.TrimSpace(entry), ""); err != nil {
				t.Fatalf("entry %q does not allow itself: %v", entry, err)
			}
		}
	})
}
