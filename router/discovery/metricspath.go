package discovery

import (
	"strconv"
	"strings"

	"github.com/oasis-llm/oasis/router/worker"
)

// maxMetricsPath bounds oasis_metrics_path: engines serve /metrics, or
// TensorRT-LLM /prometheus/metrics.
const maxMetricsPath = 256

// checkMetricsPath validates w's oasis_metrics_path: the router GETs
// http://<address><path> every scrape interval, so a registrant must not
// choose more than a plain absolute path on the engine's own address: no
// scheme or host ("@evil", "//evil" would move the request elsewhere), no
// query or fragment, no escapes, no "." or ".." segments, and a bounded
// length. Segments are letters, digits and "-._~"; a trailing "/" is kept.
func checkMetricsPath(w *worker.Worker) error {
	p := w.MetricsPath
	if p == "" {
		return nil // a hosted endpoint without one is not scraped
	}
	bad := func(reason string) error {
		return &MetaError{Key: MetaMetricsPath, Value: p, Reason: reason}
	}
	if len(p) > maxMetricsPath {
		return bad("longer than " + strconv.Itoa(maxMetricsPath) + " bytes")
	}
	if p[0] != '/' {
		return bad(`want an absolute path starting with "/"`)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '/') {
			return bad("want a plain path: letters, digits, '-', '.', '_', '~' and '/' only (no scheme, host, query or escapes)")
		}
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		switch {
		case s == "." || s == "..":
			return bad(`no "." or ".." segments`)
		case s == "" && i < len(segs)-1:
			return bad(`no empty segments ("//")`)
		}
	}
	return nil
}
