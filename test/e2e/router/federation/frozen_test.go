package federation

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/federation"
)

// frozenPolicy: short upstream timeouts so a silent peer is noticed in
// seconds; the breaker opens after two failures and probes 3 s later; a
// summary stays usable for a minute, so that while dc2 is frozen it is the
// breaker, not staleness, that stops dc1 forwarding there.
const frozenPolicy = `{"policy":"round_robin",
  "timeouts":{"response_header":"2s","stream_idle":"2s","first_token_hold":"0s"},
  "federation":{"enabled":true,"max_spill_fraction":1,"resume_spill_fraction":0.5,
    "breaker_failures":2,"breaker_cooldown":"3s","summary_stale":"60s"}}`

const streamIdle = 2 * time.Second

// startRouterProcess runs oasis-router for dc as a process of its own, so
// that SIGSTOP freezes it whole (listener, federation, pushes), in front
// of one sim registered in agent. The test registers its federation
// listener itself, without a check: the router's own registration carries
// the API's health check, which a frozen router fails within seconds, and
// peers would then drop it before their breaker had counted its failures;
// this test is about the breaker.
func startRouterProcess(t *testing.T, name string, agent *testutil.ConsulAgent, ca *tlsfilestest.CA) *testutil.Process {
	t.Helper()
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-router")
	sim := testutil.StartSim(t, testutil.SimConfig{Bin: simBin, Model: model, Args: []string{"--log-level", "warn"}})
	registerEngine(t, agent.Client, name+"-engine-0", sim.Addr)
	dir := t.TempDir()
	caFile, cert, key := ca.WriteRouterFiles(t, dir, name, "127.0.0.1")
	pol := filepath.Join(dir, "policy.json")
	must.NoError(t, os.WriteFile(pol, []byte(frozenPolicy), 0o600))
	fedAddr := testutil.FreeAddr(t)
	p := testutil.Start(t, exec.Command(bin, "-listen", testutil.FreeAddr(t), "-consul-addr", agent.HTTPAddr,
		"-policy-file", pol, "-federation-listen", fedAddr, "-federation-dc", name,
		"-federation-tls-cert", cert, "-federation-tls-key", key, "-federation-tls-ca", caFile,
		"-log-level", "warn"))
	host, portS, err := net.SplitHostPort(fedAddr)
	must.NoError(t, err)
	port, err := strconv.Atoi(portS)
	must.NoError(t, err)
	must.NoError(t, agent.Client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: federation.Service + "-" + name, Name: federation.Service, Address: host, Port: port,
		Meta: map[string]string{federation.MetaDC: name, federation.MetaModels: model}}))
	return p
}

// dc2's router is frozen while a stream from dc1 passes through it: the
// client's stream ends with an error event within stream_idle (and slack),
// dc1's breaker for dc2 opens after breaker_failures failed forwards, and
// requests are forwarded to dc2 again once it is thawed and the cooldown
// has passed. dc1 has no engine, so everything it serves goes to dc2.
func TestFederationRemoteRouterFrozen(t *testing.T) {
	c1, c2 := testutil.StartConsulWAN(t)
	ca := tlsfilestest.NewCA(t, "federation")
	dc1 := startDCWith(t, "dc1", c1, ca, dcOpts{policy: frozenPolicy})
	r2 := startRouterProcess(t, "dc2", c2, ca)
	dc2Label := map[string]string{"dc": "dc2"}
	// dc2's first summaries may precede its engine's discovery.
	testutil.Eventually(t, 60*time.Second, "a request through dc1 served by dc2", func() bool {
		resp, _ := dc1.chat(t, 8)
		return resp.StatusCode == http.StatusOK
	})

	t.Cleanup(func() { _ = syscall.Kill(r2.Pid(), syscall.SIGCONT) })
	frozen := streamUntilFrozen(t, dc1, r2.Pid())

	// Each forward now waits response_header for nothing, then fails.
	testutil.Eventually(t, 30*time.Second, "dc1's breaker for dc2 to open", func() bool {
		resp, _ := dc1.chat(t, 4)
		return resp.StatusCode != http.StatusOK &&
			dc1.metric(t, "oasis_router_federation_breaker_state", dc2Label) == 1
	})
	t.Logf("breaker open %v after the freeze, %v forward failures", time.Since(frozen).Round(10*time.Millisecond),
		dc1.metric(t, "oasis_router_federation_forward_failures_total", dc2Label))
	// While open, dc1 sends nothing to dc2 and answers at once (404: it has
	// never served the model itself).
	t0, fwd := time.Now(), dc1.metric(t, "oasis_router_federation_forwarded_total", dc2Label)
	resp, _ := dc1.chat(t, 4)
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	must.Less(t, time.Second, time.Since(t0), must.Sprint("an open breaker answers at once"))
	must.Eq(t, fwd, dc1.metric(t, "oasis_router_federation_forwarded_total", dc2Label))

	must.NoError(t, syscall.Kill(r2.Pid(), syscall.SIGCONT))
	thawed := time.Now()
	testutil.Eventually(t, 30*time.Second, "a request forwarded to dc2 again", func() bool {
		resp, body := dc1.chat(t, 8)
		return resp.StatusCode == http.StatusOK && !strings.Contains(body, `"error"`)
	})
	t.Logf("forwarded again %v after the thaw", time.Since(thawed).Round(10*time.Millisecond))
	must.Greater(t, fwd, dc1.metric(t, "oasis_router_federation_forwarded_total", dc2Label))
	must.Eq(t, 0.0, dc1.metric(t, "oasis_router_federation_breaker_state", dc2Label))
}

// streamUntilFrozen starts a long stream through dc1 (served in dc2),
// freezes the process pid once tokens flow, and asserts that the client's
// stream ends with an error event (then [DONE]) within stream_idle and
// slack. It returns
// when the freeze began.
func streamUntilFrozen(t *testing.T, dc1 *dc, pid int) time.Time {
	t.Helper()
	resp, err := http.Post(dc1.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("a long story", 3000)))
	must.NoError(t, err)
	defer resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	var frozen time.Time
	var events int
	var prev, last string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		events, prev, last = events+1, last, data
		if events == 5 {
			must.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
			frozen = time.Now()
		}
	}
	must.False(t, frozen.IsZero(), must.Sprintf("the stream ended after %d events", events))
	ended := time.Since(frozen)
	t.Logf("stream ended %v after the freeze, %d events; error event: %s", ended.Round(10*time.Millisecond), events, prev)
	// As vLLM ends a failed stream: an error event, then [DONE].
	must.StrContains(t, prev, `"error"`, must.Sprint("the stream ends with an error event"))
	must.Eq(t, "[DONE]", last)
	must.Less(t, streamIdle+3*time.Second, ended)
	return frozen
}
