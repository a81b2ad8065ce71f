package discovery

import (
	"context"
	"slices"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// Instances answers once with the passing instances of the service (a
// critical one left out, a tag filter applied) without blocking.
func TestConsulInstances(t *testing.T) {
	client, _ := testutil.StartConsul(t)
	reg := func(id, tag, status string) {
		t.Helper()
		must.NoError(t, client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: id, Name: EngineService, Address: "127.0.0.1", Port: 8000, Tags: []string{tag},
			Meta:  map[string]string{MetaModel: "m"},
			Check: &consulapi.AgentServiceCheck{TTL: "1m", Status: status},
		}))
	}
	reg("a", "blue", consulapi.HealthPassing)
	reg("b", "green", consulapi.HealthPassing)
	reg("c", "blue", consulapi.HealthCritical)

	ids := func(c *Consul) []string {
		t.Helper()
		in, err := c.Instances(context.Background())
		must.NoError(t, err)
		var out []string
		for _, i := range in {
			out = append(out, i.ID)
		}
		slices.Sort(out)
		return out
	}
	must.Eq(t, []string{"a", "b"}, ids(&Consul{Client: client}))
	must.Eq(t, []string{"a"}, ids(&Consul{Client: client, Tag: "blue"}))
	must.Eq(t, []string(nil), ids(&Consul{Client: client, Service: "other"}))
}
