// Package tracing runs the router job (jobs/router.nomad.hcl with otlp_endpoint) in front of two
// oasis-sim engines on the real Nomad + Consul test bed, with a Jaeger all-in-one run by Nomad as
// the trace backend, and checks the span tree Jaeger stores for a request that came with the
// client's W3C traceparent.
package tracing

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }

// Span names and attribute keys of router/gateway/tracing.go (the e2e tests the binary, not
// the package, so they are spelled out).
const (
	rootSpan      = "POST /v1/chat/completions"
	admissionSpan = "oasis.admission"
	routeSpan     = "oasis.route"
	upstreamSpan  = "oasis.upstream"
)

func TestRouterTracesRequestsInJaeger(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	jaeger, err := stack.RunJaeger(ctx, "")
	must.NoError(t, err)
	for _, id := range []string{"trace-sim-a", "trace-sim-b"} {
		_, err := stack.RunJobHCL(ctx, testbed.SimEngine{ID: id}.HCL())
		must.NoError(t, err)
	}
	_, err = stack.WaitServicePassing(ctx, "oasis-engine", 2)
	must.NoError(t, err)
	base := runRouter(ctx, t, jaeger.OTLP)

	// Sampling ratio 0: only the client's sampled traceparent makes a trace.
	traceID, parentID := randomHex(16), randomHex(8)
	post(t, base, "00-"+traceID+"-"+parentID+"-01")
	unsampled := randomHex(16)
	post(t, base, "00-"+unsampled+"-"+randomHex(8)+"-00")

	var tr *testbed.JaegerTrace
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		tr, err = jaeger.Trace(ctx, traceID)
		if err != nil {
			return err
		}
		if len(tr.Spans) < 4 {
			return fmt.Errorf("%d spans so far", len(tr.Spans))
		}
		return nil
	}), wait.Timeout(30*time.Second), wait.Gap(250*time.Millisecond)))
	checkSpanTree(t, tr, parentID)
	t.Logf("trace: %s/api/traces/%s", jaeger.Query, traceID)
	for _, s := range tr.Spans {
		t.Logf("  %s (parent %s): %d tags", s.OperationName, parentName(tr, s), len(s.Tags))
		for _, tg := range s.Tags {
			if strings.HasPrefix(tg.Key, "oasis.") || strings.HasPrefix(tg.Key, "gen_ai.") {
				t.Logf("    %s = %v", tg.Key, tg.Value)
			}
		}
	}

	_, err = jaeger.Trace(ctx, unsampled)
	must.Error(t, err, must.Sprint("an unsampled traceparent made a trace at ratio 0"))
}

// runRouter runs jobs/router.nomad.hcl on a free port, exporting to otlp, and returns its base URL
// once it routes.
func runRouter(ctx context.Context, t *testing.T, otlp string) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "router.nomad.hcl"), map[string]string{
		"region": stack.Region, "oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr,
		"nomad_addr": stack.NomadAddr, "http_port": fmt.Sprint(ports[0]),
		"otlp_endpoint": otlp, "trace_sample_ratio": "0",
	}))
	base := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the router's /ready to answer 200", func() bool {
		resp, err := http.Get(base + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base
}

// post sends one streaming completion with traceparent and reads it to the end.
func post(t *testing.T, base, traceparent string) {
	t.Helper()
	body := `{"model":"llama","stream":true,"max_tokens":4,"stream_options":{"include_usage":true},` +
		`"messages":[{"role":"user","content":"Hello, traces!"}]}`
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	must.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	must.EqOp(t, http.StatusOK, resp.StatusCode, must.Sprint(string(out)))
}

// checkSpanTree: the router's server span is the child of the client's span, admission, the
// routing decision and the upstream attempt are its children, and it carries the request's
// attributes.
func checkSpanTree(t *testing.T, tr *testbed.JaegerTrace, clientSpan string) {
	t.Helper()
	byName := map[string]testbed.JaegerSpan{}
	var names []string
	for _, s := range tr.Spans {
		byName[s.OperationName] = s
		names = append(names, s.OperationName)
	}
	root, ok := byName[rootSpan]
	must.True(t, ok, must.Sprintf("spans: %v", names))
	must.EqOp(t, clientSpan, root.Parent())
	for _, n := range []string{admissionSpan, routeSpan, upstreamSpan} {
		s, ok := byName[n]
		must.True(t, ok, must.Sprintf("no %s span in %v", n, names))
		must.EqOp(t, root.SpanID, s.Parent(), must.Sprintf("%s's parent", n))
	}
	tag := func(s testbed.JaegerSpan, key string) any {
		v, ok := s.Tag(key)
		must.True(t, ok, must.Sprintf("%s has no tag %s", s.OperationName, key))
		return v
	}
	must.EqOp(t, "llama", tag(root, "gen_ai.request.model").(string))
	must.EqOp(t, float64(200), tag(root, "http.response.status_code").(float64))
	must.EqOp(t, "weighted", tag(root, "oasis.policy").(string)) // the default policy
	worker := tag(root, "oasis.worker").(string)
	must.NotEq(t, "", worker)
	must.EqOp(t, worker, tag(byName[upstreamSpan], "oasis.worker").(string))
	for _, term := range []string{"ttft", "prefix", "load", "power"} {
		v := tag(root, "oasis.policy.term."+term).(float64)
		must.Between(t, 0, v, 1)
	}
	must.Positive(t, tag(root, "oasis.ttft_ms").(float64))
	must.EqOp(t, float64(0), tag(root, "oasis.retries").(float64))
	_ = tag(root, "oasis.queue_wait_ms")
	// The sims are oasis_engine=sim: the router tokenizes with the sim's tokenizer, for the
	// default policy's prefix and ttft terms, inside the decision.
	tok, ok := byName["oasis.tokenize"]
	must.True(t, ok, must.Sprintf("no oasis.tokenize span in %v", names))
	must.EqOp(t, routeSpan, parentName(tr, tok))
	must.Positive(t, tag(tok, "oasis.prompt_tokens").(float64))
	must.EqOp(t, "none", tag(root, "oasis.prefix.tier").(string)) // a fresh prompt
	must.Positive(t, tag(root, "gen_ai.usage.output_tokens").(float64))
}

// parentName is the operation name of s's parent.
func parentName(tr *testbed.JaegerTrace, s testbed.JaegerSpan) string {
	for _, p := range tr.Spans {
		if p.SpanID == s.Parent() {
			return p.OperationName
		}
	}
	return ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
