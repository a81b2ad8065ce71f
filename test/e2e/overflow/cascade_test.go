package overflow

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

const (
	cascadeAlias = "e2e-assistant"
	smallModel   = "e2e-small"
	largeModel   = "e2e-large"
)

// TestCascadeOnTheTestBed: a request for the cascade's alias runs on the small model's engine;
// an answer whose mean token logprob clears the threshold is the client's, one that does not is
// escalated to the large model's engine. oasis-sim's prompt marker sets the logprobs.
func TestCascadeOnTheTestBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	doc := `{"policy":"round_robin","cascades":{"` + cascadeAlias + `":{"small":"` + smallModel +
		`","large":"` + largeModel + `","gate":"logprob","threshold":-0.5,"max_small_tokens":64}}}`
	_, err := stack.Consul.KV().Put(&consulapi.KVPair{Key: "oasis/router/policy", Value: []byte(doc)}, nil)
	must.NoError(t, err)
	t.Cleanup(func() {
		for _, id := range []string{"cascade-small", "cascade-large", "oasis-router"} {
			_ = stack.StopJob(context.Background(), id)
		}
	})
	for id, model := range map[string]string{"cascade-small": smallModel, "cascade-large": largeModel} {
		_, err = stack.RunJobHCL(ctx, testbed.SimEngine{ID: id, Model: model}.HCL())
		must.NoError(t, err)
	}
	_, err = stack.WaitServicePassing(ctx, "oasis-engine", 2)
	must.NoError(t, err)
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	port := testutil.FreePort(t)
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "router.nomad.hcl"), map[string]string{
		"oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr, "nomad_addr": stack.NomadAddr,
		"http_port": strconv.Itoa(port)}))
	url := "http://127.0.0.1:" + strconv.Itoa(port)

	var status int
	var hdr http.Header
	var body string
	testutil.Eventually(t, 90*time.Second, "the router to serve the cascade's alias", func() bool {
		status, hdr, body = cascadeChat(ctx, url, "[oasis:logprob=-0.1] warm up", false)
		return status == http.StatusOK
	})
	for _, tc := range []struct {
		name, marker, outcome, model string
		stream                       bool
	}{
		{"confident small answer kept", "[oasis:logprob=-0.1]", "small", smallModel, false},
		{"unsure small answer escalated", "[oasis:logprob=-2.5]", "escalated", largeModel, false},
		{"streamed, escalated", "[oasis:logprob=-2.5]", "escalated", largeModel, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body = cascadeChat(ctx, url, tc.marker+" tell me about Nomad", tc.stream)
			must.Eq(t, http.StatusOK, status, must.Sprint(body))
			must.Eq(t, tc.outcome, hdr.Get("X-Oasis-Cascade"))
			must.StrContains(t, body, `"model":"`+tc.model+`"`)
			if tc.stream {
				must.StrHasSuffix(t, "data: [DONE]\n\n", body)
			}
		})
	}
	metrics := get(t, url+"/metrics")
	must.StrContains(t, metrics, fmt.Sprintf(`oasis_router_cascade_requests_total{alias=%q,outcome="escalated"} 2`, cascadeAlias))
}

func cascadeChat(ctx context.Context, url, prompt string, stream bool) (int, http.Header, string) {
	body := fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`,
		cascadeAlias, stream, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, nil, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}
