package gateway

// Compression (issue #36): engines and hosted APIs are asked for identity
// encoding, so the router can read usage and cascades' small answers; the
// router compresses a whole (non-streaming) answer toward a client that
// accepts gzip. Event streams stay uncompressed: each event must reach the
// client when it arrives, and a gzip stream flushed per event costs a
// sync block per event and is buffered by some intermediaries anyway.

import (
	"compress/gzip"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// identityEncoding is the Accept-Encoding sent to engines (shared: never
// appended to).
var identityEncoding = []string{"identity"}

// gzips holds gzip writers for reuse: each holds ~800 KiB of state.
var gzips = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

// acceptsGzip reports whether an Accept-Encoding field value accepts gzip
// (by name or "*", with a q-value other than 0).
func acceptsGzip(values []string) bool {
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(part, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			if name != "gzip" && name != "x-gzip" && name != "*" {
				continue
			}
			q, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q=")
			if !ok {
				return true
			}
			if f, err := strconv.ParseFloat(q, 64); err == nil && f > 0 {
				return true
			}
		}
	}
	return false
}

// gzipFor reports whether the answer resp to r goes to the client gzipped
// (a cascade's small leg, read by the router, never is):
// the client accepts gzip, asked for no stream, and the engine sent a
// successful, unencoded answer.
func gzipFor(r *http.Request, stream bool, resp *http.Response) bool {
	return !stream && resp.StatusCode/100 == 2 && resp.Header.Get("Content-Encoding") == "" &&
		acceptsGzip(r.Header["Accept-Encoding"])
}

// gzipWriter compresses what is written to it into its ResponseWriter.
type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
}

func newGzipWriter(w http.ResponseWriter) *gzipWriter {
	gz := gzips.Get().(*gzip.Writer)
	gz.Reset(w)
	return &gzipWriter{ResponseWriter: w, gz: gz}
}

// WriteHeader marks the answer gzipped; its length is no longer known.
func (w *gzipWriter) WriteHeader(status int) {
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Encoding", "gzip")
	h.Add("Vary", "Accept-Encoding")
	w.ResponseWriter.WriteHeader(status)
}

func (w *gzipWriter) Write(p []byte) (int, error) { return w.gz.Write(p) }

// Flush sends what was compressed so far.
func (w *gzipWriter) Flush() {
	_ = w.gz.Flush()
	if fl, ok := w.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
}

// close ends the gzip stream and gives its writer back.
func (w *gzipWriter) close() {
	_ = w.gz.Close()
	w.gz.Reset(nil)
	gzips.Put(w.gz)
}
