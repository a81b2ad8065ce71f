package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/metrics"
)

// TestGracefulShutdownDrainsStreams runs the oasis-router binary, starts a
// slow stream, sends SIGTERM mid-stream and expects the stream to finish, the
// router to deregister from Consul and to exit 0.
func TestGracefulShutdownDrainsStreams(t *testing.T) {
	s := startSim(t, "alpha", "--speed", "1", "--step-time-base", "40ms")
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	listen := "127.0.0.1:" + strconv.Itoa(ports[0])
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.json")
	must.NoError(t, os.WriteFile(pol, []byte(`{"policy":"round_robin"}`), 0o644))
	logf, err := os.Create(filepath.Join(dir, "router.log"))
	must.NoError(t, err)
	defer logf.Close()
	cmd := exec.Command(routerBin, "-listen", listen, "-discovery", "static", "-engines", "alpha="+s.Addr,
		"-policy-file", pol, "-consul-addr", consul.addr, "-register", "-shutdown-timeout", "20s")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			out, _ := os.ReadFile(filepath.Join(dir, "router.log"))
			t.Logf("router log:\n%s", out)
		}
	}()
	url := "http://" + listen
	testutil.EventuallyEvery(t, 20*time.Second, 50*time.Millisecond, "the router's /ready to answer 200", func() bool {
		resp, err := http.Get(url + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	registered := func() int {
		svcs, _, err := consul.client.Catalog().Service("oasis-router", "", nil)
		must.NoError(t, err)
		return len(svcs)
	}
	must.Eq(t, 1, registered())

	body := `{"model":"alpha","messages":[{"role":"user","content":"hi"}],"max_tokens":30,"stream":true}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n') // the stream has started
	must.NoError(t, err)

	must.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	events, done := 1, false
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: {") {
			events++
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			done = true
		}
		if err != nil {
			break
		}
	}
	must.True(t, done, must.Sprint("the in-flight stream finished after SIGTERM"))
	must.Greater(t, 25, events)
	select {
	case err := <-exited:
		must.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("router did not exit after draining")
	}
	must.Eq(t, 0, registered())
}

func TestAPIKeysFromConsulKV(t *testing.T) {
	c := consul.client
	key := "oasis-it/" + sanitize(t.Name()) + "/keys"
	defer c.KV().Delete(key, nil)
	m := metrics.New(prometheus.NewRegistry())
	a := auth.New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.WatchKV(ctx, c, key, m, hclog.NewNullLogger()); close(done) }()
	defer func() { cancel(); <-done }()

	req := func(k string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "Bearer "+k)
		return r
	}
	digest := func(k string) string { d := sha256.Sum256([]byte(k)); return hex.EncodeToString(d[:]) }
	put := func(doc string) {
		_, err := c.KV().Put(&consulapi.KVPair{Key: key, Value: []byte(doc)}, nil)
		must.NoError(t, err)
	}
	authed := func(k string) bool { _, err := a.Authenticate(req(k)); return err == nil }
	eventually := func(what string, cond func() bool) { testutil.Eventually(t, 5*time.Second, what, cond) }

	// No document: nobody gets in.
	must.False(t, authed("sk-one"))
	put(fmt.Sprintf(`{"keys":[{"id":"one","sha256":%q}]}`, digest("sk-one")))
	eventually("sk-one to be accepted", func() bool { return authed("sk-one") })
	// A bad document is rejected and the keys stay.
	put(`{"keys":[{"id":"x","sha256":"sk-two-in-clear"}]}`)
	eventually("the bad document to be rejected", func() bool { return promtest.ToFloat64(m.KeyReloads.WithLabelValues("rejected")) == 1 })
	must.True(t, authed("sk-one"))
	// Rotation: the old key stops working, the new one starts.
	put(fmt.Sprintf(`{"keys":[{"id":"two","sha256":%q}]}`, digest("sk-two")))
	eventually("the key rotation", func() bool { return authed("sk-two") && !authed("sk-one") })
	// Deleting the document locks everyone out.
	_, err := c.KV().Delete(key, nil)
	must.NoError(t, err)
	eventually("everyone locked out", func() bool { return !authed("sk-two") })
}
