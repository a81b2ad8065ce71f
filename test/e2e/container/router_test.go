package container

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/app"
	"github.com/oasis-llm/oasis/router/policy"
)

// startRouter runs the router (router/app, as cmd/oasis-router assembles
// it) discovering this package's engines in Consul by tag; it returns the
// router's base URL once it serves model.
func startRouter(t *testing.T, tag, model string) string {
	t.Helper()
	data, err := json.Marshal(policy.Default())
	must.NoError(t, err)
	pol := filepath.Join(t.TempDir(), "policy.json")
	must.NoError(t, os.WriteFile(pol, data, 0o600))
	t.Setenv("CONSUL_HTTP_TOKEN", stack.ConsulToken)
	listen := testutil.FreeAddr(t)
	a, err := app.New(app.Config{Listen: listen, Discovery: app.DiscoveryConsul, ConsulAddr: stack.ConsulAddr,
		ServiceTag: tag, PolicyFile: pol, ScrapeInterval: time.Second, ShutdownTimeout: 5 * time.Second,
		Registry: prometheus.NewRegistry(), Logger: hclog.NewNullLogger()})
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "http://" + listen
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the router's /v1/models to list the model", func() bool {
		resp, err := http.Get(url + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"`+model+`"`)
	})
	return url
}
