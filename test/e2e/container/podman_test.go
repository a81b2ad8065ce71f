package container

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// api is a small client of the test's Podman service, for what the tests
// check behind the driver's back.
type api struct{ c *http.Client }

func newAPI() api {
	return api{c: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", podmanSocket)
		}}}}
}

func (a api) get(path string, q url.Values, out any) (int, error) {
	u := "http://podman/v4.0.0" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	resp, err := a.c.Get(u)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode == http.StatusOK {
		return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func (a api) version() (string, error) {
	var v struct{ Version string }
	code, err := a.get("/libpod/version", nil, &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("HTTP %d", code)
	}
	return v.Version, err
}

type ctrSummary struct {
	ID     string            `json:"Id"`
	State  string            `json:"State"`
	Pid    int               `json:"Pid"`
	Labels map[string]string `json:"Labels"`
}

// containersOf lists the containers (running or not) of an allocation.
func (a api) containersOf(t *testing.T, allocID string) []ctrSummary {
	t.Helper()
	var out []ctrSummary
	filters, _ := json.Marshal(map[string][]string{"label": {"io.oasis.alloc_id=" + allocID}})
	code, err := a.get("/libpod/containers/json", url.Values{"all": {"true"}, "filters": {string(filters)}}, &out)
	must.NoError(t, err)
	must.EqOp(t, http.StatusOK, code)
	return out
}

const simImage = "localhost/oasis-sim:e2e"

var buildOnce sync.Once

// buildSimImage builds an image FROM scratch holding the test bed's
// oasis-sim and the shared libraries it links (no registry is reachable).
func buildSimImage(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		dir := t.TempDir()
		root := filepath.Join(dir, "rootfs")
		bin := stack.Bin("oasis-sim")
		files := []string{bin}
		if out, err := exec.Command("ldd", bin).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if strings.HasPrefix(f, "/") {
					files = append(files, f)
				}
			}
		}
		for _, f := range files {
			dst := filepath.Join(root, f)
			if f == bin {
				dst = filepath.Join(root, "usr/local/bin/oasis-sim")
			}
			must.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
			b, err := os.ReadFile(f)
			must.NoError(t, err)
			must.NoError(t, os.WriteFile(dst, b, 0o755))
		}
		must.NoError(t, os.WriteFile(filepath.Join(dir, "Containerfile"),
			[]byte("FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/local/bin\n"), 0o644))
		cmd := exec.Command("podman", "build", "-q", "-t", simImage, dir)
		out, err := cmd.CombinedOutput()
		must.NoError(t, err, must.Sprint(string(out)))
	})
	code, err := newAPI().get("/libpod/images/"+simImage+"/exists", nil, nil)
	must.NoError(t, err)
	must.EqOp(t, http.StatusNoContent, code, must.Sprint("image ", simImage, " was not built"))
}
