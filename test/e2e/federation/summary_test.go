package federation

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// One federation summary per datacenter, on real router processes: two
// routers in dc1 (as the system job runs one per node), each with requests
// held on its engine, and a router in dc2 that sees dc1's whole load (the
// sum of both routers' summaries: 2 + 3 in flight), not whichever router
// pushed last; a dc1 router killed leaves the sum within summary_stale.
func TestPeerSeesADatacentersWholeLoad(t *testing.T) {
	dc1, dc2 := fed.DC("dc1"), fed.DC("dc2")
	ca := tlsfilestest.NewCA(t, "oasis-federation")
	release := make(chan struct{})
	held := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // the engine's work: held until the test ends
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
	}))
	t.Cleanup(held.Close)
	t.Cleanup(func() { close(release) }) // before held.Close (cleanups run last first): the held requests end
	engine := "m=" + strings.TrimPrefix(held.URL, "http://")

	a := startFedRouter(t, ca, dc1, engine)
	b := startFedRouter(t, ca, dc1, engine)
	c := startFedRouter(t, ca, dc2, engine) // static discovery needs an engine; nothing is sent to it
	send := func(url string, n int) {
		for range n {
			go func() {
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":1}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
	}
	send(a.url, 2)
	send(b.url, 3)
	metric := func(name string) float64 {
		ms, err := testutil.ScrapeMetrics(context.Background(), nil, c.url+"/metrics")
		if err != nil {
			return -1
		}
		return ms.Sum(name, map[string]string{"dc": "dc1"})
	}
	testutil.EventuallyEvery(t, 60*time.Second, 100*time.Millisecond, "dc2's router to sum dc1's two routers: 5 in flight", func() bool {
		return metric("oasis_router_federation_remote_routers") == 2 && metric("oasis_router_federation_remote_in_flight") == 5
	})
	must.NoError(t, b.Kill())
	start := time.Now()
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the killed router's part out of dc2's sum", func() bool {
		return metric("oasis_router_federation_remote_routers") == 1 && metric("oasis_router_federation_remote_in_flight") == 2
	})
	t.Logf("a killed dc1 router left dc2's sum %v after the kill (summary_stale 3 s)", time.Since(start).Round(100*time.Millisecond))
}

type fedRouter struct {
	*testutil.Process
	url string
}

// startFedRouter runs an oasis-router process in s's datacenter with
// federation on (its datacenter's certificate from ca, registered in s's
// Consul with the management token) in front of engines.
func startFedRouter(t *testing.T, ca *tlsfilestest.CA, s *testbed.Stack, engines string) *fedRouter {
	t.Helper()
	dir := t.TempDir()
	caFile, certFile, keyFile := ca.WriteRouterFiles(t, dir, s.Datacenter, "127.0.0.1")
	pol := filepath.Join(dir, "policy.json")
	must.NoError(t, os.WriteFile(pol, []byte(fedPolicy), 0o600))
	listen := testutil.FreeAddr(t)
	args := []string{"-listen", listen, "-discovery", "static", "-policy-file", pol, "-consul-addr", s.ConsulAddr, "-register",
		"-scrape-interval", "0", "-log-level", "warn", "-shutdown-timeout", "2s", "-federation-listen", "127.0.0.1:0", "-federation-dc", s.Datacenter,
		"-federation-tls-cert", certFile, "-federation-tls-key", keyFile, "-federation-tls-ca", caFile, "-engines", engines}
	cmd := exec.Command(filepath.Join(s.BinDir, "oasis-router"), args...)
	cmd.Env = append(os.Environ(), "CONSUL_HTTP_TOKEN="+s.ConsulToken)
	p := testutil.Start(t, cmd)
	r := &fedRouter{Process: p, url: "http://" + listen}
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the router's API up", func() bool {
		resp, err := http.Get(r.url + "/v1/models")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}
