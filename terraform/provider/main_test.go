package provider

import (
	"context"
	"os"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tofutest"
)

// providerBin is the provider built once for every tofu-driven test.
var providerBin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithCommand(m, tofutest.ProviderPackage, &providerBin))
}

// testBed is one Consul dev agent shared by the tofu-driven subtests; each
// subtest uses its own kv_prefix.
type testBed struct {
	consul *consulapi.Client
	addr   string
}

// tofu copies module into a fresh directory, installs the provider built in
// TestMain and runs init; the provider reaches the bed's Consul.
func (b *testBed) tofu(t *testing.T, module, kvPrefix string) *tofutest.Tofu {
	t.Helper()
	tf := tofutest.New(t, tofutest.Options{Module: module, Provider: providerBin,
		Env: []string{"CONSUL_HTTP_ADDR=" + b.addr, "TF_VAR_kv_prefix=" + kvPrefix}})
	tf.Init(context.Background())
	return tf
}

// TestAgainstConsul runs the tofu-driven tests against one real Consul.
func TestAgainstConsul(t *testing.T) {
	if tofutest.Binary() == "" {
		testutil.SkipUnlessCI(t, "no tofu binary: set OASIS_TOFU_BIN or run make hashistack (bin/tofu)")
	}
	client, addr := testutil.StartConsul(t)
	b := &testBed{consul: client, addr: addr}
	t.Run("router_policy", b.testRouterPolicy)
	t.Run("api_keys", b.testAPIKeys)
	t.Run("api_keys_concurrent", b.testAPIKeysConcurrent)
	t.Run("pool", b.testPool)
}

// addresses are the addresses of a plan's changes, each with its actions.
func addresses(p *tofutest.Plan) map[string][]string {
	out := map[string][]string{}
	for _, c := range p.Changed() {
		out[c.Address] = c.Change.Actions
	}
	return out
}

func kvPut(t *testing.T, c *consulapi.Client, key string, value []byte) {
	t.Helper()
	_, err := c.KV().Put(&consulapi.KVPair{Key: key, Value: value}, nil)
	must.NoError(t, err)
}

func kvValue(t *testing.T, c *consulapi.Client, key string) *consulapi.KVPair {
	t.Helper()
	pair, _, err := c.KV().Get(key, nil)
	must.NoError(t, err)
	return pair
}
