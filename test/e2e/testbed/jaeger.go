package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// JaegerJobID is the job RunJaeger runs.
const JaegerJobID = "jaeger"

// Jaeger is a Jaeger all-in-one (v2: an OpenTelemetry Collector with Jaeger's memory storage and
// query API) run by Nomad on the stack, on free loopback ports.
type Jaeger struct {
	// OTLP is the OTLP/HTTP receiver's base URL (the router's -otlp-endpoint).
	OTLP string
	// Query is the query service's base URL: /api/traces/<trace id>, /api/services.
	Query string
}

// RunJaeger runs bin (default: $OASIS_JAEGER_BIN, else the checkout's bin/jaeger, built by
// scripts/hashistack.sh) as the raw_exec job
// JaegerJobID and waits until its query API answers. The stack's Close stops it with the other jobs.
func (s *Stack) RunJaeger(ctx context.Context, bin string) (*Jaeger, error) {
	if bin == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		if bin, err = hashiBinary(root, "jaeger", "OASIS_JAEGER_BIN"); err != nil {
			return nil, err
		}
	}
	ports, err := testutil.FreePorts(3)
	if err != nil {
		return nil, err
	}
	otlp, query, grpc := ports[0], ports[1], ports[2]
	if _, err := s.RunJobHCL(ctx, jaegerJob(s.Region, bin, otlp, query, grpc)); err != nil {
		return nil, fmt.Errorf("running jaeger: %w", err)
	}
	j := &Jaeger{OTLP: "http://127.0.0.1:" + strconv.Itoa(otlp), Query: "http://127.0.0.1:" + strconv.Itoa(query)}
	err = poll(ctx, 200*time.Millisecond, "jaeger's query API", func() (bool, error) {
		resp, err := http.Get(j.Query + "/api/services")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return j, err
}

// jaegerJob is the jobspec: Jaeger's own all-in-one configuration less everything but OTLP/HTTP
// in, memory storage and the query API, each on the given loopback port (no default port: other
// stacks on the machine may hold them), and no self-telemetry listener.
func jaegerJob(region, bin string, otlp, query, grpc int) string {
	config := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 200ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`, query, grpc, otlp)
	return fmt.Sprintf(`job %q {
  region      = %q
  datacenters = ["*"]
  group "jaeger" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "jaeger" {
      driver = "raw_exec"
      config {
        command = %q
        args    = ["--config", "local/jaeger.yaml"]
      }
      template {
        destination = "local/jaeger.yaml"
        data        = %q
      }
      resources {
        cpu    = 200
        memory = 256
      }
    }
  }
}
`, JaegerJobID, region, bin, config)
}

// JaegerTrace is one trace as Jaeger's query API returns it.
type JaegerTrace struct {
	TraceID string       `json:"traceID"`
	Spans   []JaegerSpan `json:"spans"`
}

// JaegerSpan is one span of a JaegerTrace.
type JaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	Tags []struct {
		Key   string `json:"key"`
		Type  string `json:"type"`
		Value any    `json:"value"`
	} `json:"tags"`
}

// Parent is the span's CHILD_OF reference ("" for a root of the stored trace).
func (s JaegerSpan) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Tag returns a tag's value.
func (s JaegerSpan) Tag(key string) (any, bool) {
	for _, t := range s.Tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return nil, false
}

// errNoTrace is a trace the query API does not know (yet).
var errNoTrace = errors.New("trace not found")

// Trace fetches a trace by its id (32 hex digits).
func (j *Jaeger) Trace(ctx context.Context, id string) (*JaegerTrace, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+"/api/traces/"+id, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, errNoTrace
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/traces/%s: %s", id, resp.Status)
	}
	var out struct {
		Data []JaegerTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if len(out.Data) == 0 {
		return nil, errNoTrace
	}
	return &out.Data[0], nil
}
