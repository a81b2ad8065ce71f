package enginestats

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
)

// TestPollNodesReportsGPUHealth: the node's GPU fingerprints (one instance
// marked unhealthy by a critical Xid) become node_gpus by health; other
// device types are not counted.
func TestPollNodesReportsGPUHealth(t *testing.T) {
	nomad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/node/n1" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"ID":"n1","NodeResources":{"Devices":[
			{"Vendor":"nvidia","Type":"gpu","Name":"A100","Instances":[
				{"ID":"GPU-0","Healthy":true},
				{"ID":"GPU-1","Healthy":false,"HealthDescription":"critical Xid 79: GPU has fallen off the bus"},
				{"ID":"GPU-2","Healthy":true}]},
			{"Vendor":"intel","Type":"fpga","Name":"x","Instances":[{"ID":"F-0","Healthy":false}]}]}}`)
	}))
	defer nomad.Close()
	nc, err := nomadapi.NewClient(&nomadapi.Config{Address: nomad.URL})
	must.NoError(t, err)
	pool := discovery.New(discovery.Config{})
	pool.Set([]discovery.Instance{{ID: "a", Address: "127.0.0.1:1", Meta: map[string]string{discovery.MetaModel: "m", discovery.MetaNode: "n1"}}})
	s, err := NewScraper(ScraperConfig{Pool: pool, Nomad: nc, Metrics: metrics.New(prometheus.NewRegistry())})
	must.NoError(t, err)

	s.pollNodes(context.Background())
	must.Eq(t, 2.0, testutil.ToFloat64(s.m.NodeGPUs.WithLabelValues("n1", "healthy")))
	must.Eq(t, 1.0, testutil.ToFloat64(s.m.NodeGPUs.WithLabelValues("n1", "unhealthy")))
}
