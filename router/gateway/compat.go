package gateway

// vLLM's API beyond generation (issue #36): its other model endpoints are
// proxied like embeddings (by the model the body names; no prefill/decode
// pair, no cascade), /version goes to any healthy engine, and a wrong
// method on a known path is 405 with Allow, as vLLM answers.

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"

	"github.com/oasis-llm/oasis/router/openai"
)

// modelPaths are the POST endpoints proxied to an engine serving the model
// their body names: generation's, then vLLM's others.
var modelPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
	"/tokenize", "/detokenize", "/v1/score", "/score", "/v1/rerank", "/rerank", "/v2/rerank",
	"/pooling", "/classify", TranscriptionsPath, ResponsesPath}

// TranscriptionsPath takes a multipart form; its model is a form field.
const TranscriptionsPath = "/v1/audio/transcriptions"

// maxModelField bounds the model form field of a multipart request.
const maxModelField = 1 << 10

// generates reports whether path is a generation endpoint: the ones
// cascades and prefill/decode pairs apply to.
func generates(path string) bool {
	return path == "/v1/chat/completions" || path == "/v1/completions"
}

// allowed returns the methods the router serves at path, nil for an
// unknown path.
func (g *Gateway) allowed(path string) []string {
	for _, p := range modelPaths {
		if p == path {
			return []string{http.MethodPost}
		}
	}
	switch {
	case strings.HasPrefix(path, "/v1/models/") && len(path) > len("/v1/models/"):
		return []string{http.MethodGet}
	case strings.HasPrefix(path, ResponsesPath+"/") && strings.HasSuffix(path, "/cancel"):
		return []string{http.MethodPost}
	case strings.HasPrefix(path, ResponsesPath+"/") && !strings.Contains(path[len(ResponsesPath)+1:], "/"):
		return []string{http.MethodGet}
	}
	switch path {
	case "/v1/models", "/health", "/ready", "/version":
		return []string{http.MethodGet}
	case "/metrics":
		if g.cfg.Gatherer != nil {
			return []string{http.MethodGet}
		}
	}
	return nil
}

// unknownRoute answers a request no route matched: 405 with Allow for a
// wrong method on a known path, else 404.
func (g *Gateway) unknownRoute(w http.ResponseWriter, r *http.Request) {
	if ms := g.allowed(r.URL.Path); ms != nil {
		w.Header().Set("Allow", strings.Join(ms, ", "))
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
			"Method Not Allowed: "+r.Method+" "+r.URL.Path, 0)
		return
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url",
		"", "Unknown request URL: "+r.Method+" "+r.URL.Path, 0)
}

// parse reads the routing fields of body, sent to r's path, and returns
// them with the body to forward: vLLM's single-model default written into
// a JSON body that names no model (a multipart one is forwarded as it is).
func (g *Gateway) parse(r *http.Request, body []byte) (openai.Request, []byte, error) {
	f, err := parseBody(r, body)
	if m, ok := g.singleModel(err); ok {
		if r.URL.Path == TranscriptionsPath {
			return openai.Request{Model: m}, body, nil
		}
		// The body names the model for the engine (and a hosted API, which
		// requires it).
		body = openai.AppendMember(body, "model", openai.String(m))
		f, err = openai.ParseRequest(r.URL.Path, body)
	}
	return f, body, err
}

// parseBody reads the routing fields of a request to path: a multipart
// form's model field for transcriptions, else the JSON body's (ParseRequest).
func parseBody(r *http.Request, body []byte) (openai.Request, error) {
	if r.URL.Path != TranscriptionsPath {
		return openai.ParseRequest(r.URL.Path, body)
	}
	model, err := multipartModel(r.Header.Get("Content-Type"), body)
	if err != nil {
		return openai.Request{}, err
	}
	if model == "" {
		return openai.Request{}, &openai.FieldError{Field: "model", Missing: true}
	}
	return openai.Request{Model: model}, nil
}

// multipartModel returns the model field of a multipart/form-data body
// ("" when it has none), reading at most maxModelField bytes of it.
func multipartModel(contentType string, body []byte) (string, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return "", errors.New("request body must be multipart/form-data with a boundary")
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", errors.New("malformed multipart body: " + err.Error())
		}
		if p.FormName() != "model" || p.FileName() != "" {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(p, maxModelField+1))
		switch {
		case err != nil:
			return "", errors.New("malformed multipart body: " + err.Error())
		case len(b) > maxModelField:
			return "", &openai.FieldError{Field: "model", Want: "at most 1024 bytes"}
		}
		return strings.TrimSpace(string(b)), nil
	}
}

// version serves GET /version from a healthy local engine (the first by
// id, so every call asks the same one while it is healthy).
func (g *Gateway) version(w http.ResponseWriter, r *http.Request) {
	addr, id := "", ""
	for _, wk := range g.cfg.Pool.All() {
		if wk.Upstream == "" && (id == "" || wk.ID < id) {
			addr, id = wk.Address, wk.ID
		}
	}
	if addr == "" {
		writeError(w, http.StatusServiceUnavailable, "server_error", "no_healthy_worker", "",
			"no healthy engine instance known", 0)
		return
	}
	up, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+addr+"/version", nil)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "server_error", "internal_error", "", err.Error(), 0)
		return
	}
	up.Header.Set("Accept-Encoding", "identity")
	resp, err := g.cfg.Transport.RoundTrip(up)
	if err != nil {
		writeError(w, http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"the engine failed before responding: "+err.Error(), 0)
		return
	}
	defer resp.Body.Close()
	copyEndToEnd(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, 64<<10))
}
