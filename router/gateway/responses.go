package gateway

// The Responses API (issue #36). vLLM keeps a stored response (store: true,
// the default) in its own process memory, keyed by the request's
// request_id, which is also the response's id; previous_response_id, GET
// /v1/responses/{id} and .../cancel only work on the engine that holds it.
//
// The router therefore mints every response id itself, per attempt, once
// the engine is chosen: "resp_" and base64url of
//
//	version(1) | len(instance id)(1) | instance id | nonce(12) | HMAC-SHA256(key, all before)[:16]
//
// and sends it to the engine as request_id (appended to the body: the
// last member wins, so a client's own request_id is overridden). The id the
// client sees is the engine's stored key, so answers, streams included,
// pass through unchanged. A later request naming the id goes to the engine
// instance it names, on any router replica sharing the key, after a router
// restart too; an id whose MAC does not verify (forged, or from another
// key) is unknown (404), so a client cannot steer a request to an engine of
// its choosing.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// ResponsesPath is the Responses API's create endpoint.
const ResponsesPath = "/v1/responses"

// MinResponseIDKey is the shortest Config.ResponseIDKey accepted.
const MinResponseIDKey = 32

const (
	respIDPrefix  = "resp_"
	respIDVersion = 1
	respNonce     = 12
	respMAC       = 16
	// maxResponseID bounds an id a client sends (a path segment or
	// previous_response_id) before it is decoded.
	maxResponseID = 512
	// maxInstanceID bounds the engine instance id an id can carry.
	maxInstanceID = 255
)

// ErrResponseID is an id the router did not mint with its key: malformed,
// forged, or minted with another key.
var ErrResponseID = errors.New("not a response id this router's key minted")

// responseIDs mints and opens response ids with one HMAC key.
type responseIDs struct{ key []byte }

func newResponseIDs(key []byte) (*responseIDs, error) {
	if key == nil {
		// One router, ids valid until it restarts (Config.ResponseIDKey).
		key = make([]byte, MinResponseIDKey)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
	}
	if len(key) < MinResponseIDKey {
		return nil, errors.New("gateway: Config.ResponseIDKey must be at least " +
			strconv.Itoa(MinResponseIDKey) + " bytes")
	}
	return &responseIDs{key: bytes.Clone(key)}, nil
}

// mint returns a new response id naming the engine instance id.
func (ids *responseIDs) mint(instance string) (string, error) {
	if len(instance) == 0 || len(instance) > maxInstanceID {
		return "", errors.New("engine instance id of " + strconv.Itoa(len(instance)) + " bytes cannot be carried")
	}
	b := make([]byte, 0, 2+len(instance)+respNonce+respMAC)
	b = append(b, respIDVersion, byte(len(instance)))
	b = append(b, instance...)
	var nonce [respNonce]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", err
	}
	b = append(b, nonce[:]...)
	b = append(b, ids.sum(b)...)
	return respIDPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// open returns the engine instance id that id names, or ErrResponseID.
func (ids *responseIDs) open(id string) (string, error) {
	enc, ok := strings.CutPrefix(id, respIDPrefix)
	if !ok || len(id) > maxResponseID {
		return "", ErrResponseID
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(b) < 2+1+respNonce+respMAC || b[0] != respIDVersion {
		return "", ErrResponseID
	}
	n := int(b[1])
	if n == 0 || len(b) != 2+n+respNonce+respMAC {
		return "", ErrResponseID
	}
	body, mac := b[:len(b)-respMAC], b[len(b)-respMAC:]
	if !hmac.Equal(mac, ids.sum(body)) {
		return "", ErrResponseID
	}
	return string(b[2 : 2+n]), nil
}

func (ids *responseIDs) sum(b []byte) []byte {
	h := hmac.New(sha256.New, ids.key)
	h.Write([]byte("oasis-response-id\x00"))
	h.Write(b)
	return h.Sum(nil)[:respMAC]
}

// attemptBody is the body one attempt sends to wk: forwardBody's, with a
// llama-server's adapter (withLlamaLoRA), and for a create request to a
// local engine the response id minted for it.
func (g *Gateway) attemptBody(x *exchange, wk *scoring.Worker) ([]byte, error) {
	body := g.withLlamaLoRA(forwardBody(x, wk), x, wk)
	if x.req.Path != ResponsesPath || wk.Upstream != "" || x.remote != nil {
		return body, nil
	}
	id, err := g.respIDs.mint(wk.ID)
	if err != nil {
		return nil, err
	}
	return openai.AppendMember(body, "request_id", openai.String(id)), nil
}

// pinResponse reads a create request's previous_response_id: the engine
// instance that holds it is the only one c may go to (c.pin). It answers
// the client itself, and returns false, for an id the router did not mint.
func (g *Gateway) pinResponse(c *call) bool {
	if c.x.req.Path != ResponsesPath {
		return true
	}
	var v struct {
		Prev *string `json:"previous_response_id"`
	}
	if err := json.Unmarshal(c.x.body, &v); err != nil || v.Prev == nil {
		return true // a valid JSON object (parsed before); a type error is the engine's to answer
	}
	inst, err := g.respIDs.open(*v.Prev)
	if err != nil {
		c.rec.fail(c.w, http.StatusNotFound, "invalid_request_error", "response_not_found", "previous_response_id",
			responseNotFound(*v.Prev), 0)
		return false
	}
	c.pin = inst
	return true
}

// localOnly reports whether c stays in this datacenter, on its own pool:
// a Responses API request (its id is minted by this datacenter's routers,
// for one of its engines), never federated nor sent to an overflow pool
// before admission.
func (c *call) localOnly() bool { return c.pin != "" || c.x.req.Path == ResponsesPath }

func responseNotFound(id string) string {
	if len(id) > 64 {
		id = id[:64] + "…"
	}
	return "Response with id " + strconv.Quote(id) + " not found."
}

// pickPinned is pick for a request pinned to one engine instance: that
// worker while it serves the model and was not tried yet; no other.
func (g *Gateway) pickPinned(c *call, st *attempts) plan {
	for _, wk := range routable(g.cfg.Pool.Workers(c.x.req.Model), time.Now()) {
		if wk.ID != c.pin {
			continue
		}
		if st.n > 0 {
			break
		}
		st.tried = append(st.tried, wk)
		g.notePick(c, wk)
		return planWorker{wk: wk}
	}
	if st.last != nil {
		return upstreamRefusal(st.last, "; the previous response's engine is the only one that holds it")
	}
	return &refusal{status: http.StatusNotFound, typ: "invalid_request_error", code: "response_not_found",
		param: "previous_response_id", msg: "the engine holding the previous response no longer serves model " +
			strconv.Quote(c.x.req.Model) + "; stored responses live in their engine's memory"}
}

// storedResponse serves GET /v1/responses/{id} (a stored response, or with
// ?stream=true its events again) and POST /v1/responses/{id}/cancel on the
// engine instance that holds the response.
func (g *Gateway) storedResponse(w http.ResponseWriter, r *http.Request) {
	rec := &outcome{g: g, start: time.Now(), status: http.StatusOK}
	defer rec.done()
	if g.refuseLoop(w, r, rec) {
		return
	}
	id := r.PathValue("id")
	inst, err := g.respIDs.open(id)
	var wk *scoring.Worker
	if err == nil {
		wk = g.instance(inst)
	}
	if wk == nil {
		rec.fail(w, http.StatusNotFound, "invalid_request_error", "response_not_found", "", responseNotFound(id), 0)
		return
	}
	rec.model, rec.worker = wk.Model, wk.ID
	reqID := r.Header.Get("X-Request-Id")
	if reqID == "" {
		reqID = g.ids.next()
	}
	if err := g.relayStored(r.Context(), w, r, rec, wk, reqID); err != nil {
		code, status := "upstream_unavailable", http.StatusBadGateway
		switch {
		case r.Context().Err() != nil:
			rec.status = 499
			return
		case errors.Is(err, errResponseHeaderTimeout):
			code, status = "upstream_timeout", http.StatusGatewayTimeout
		case isConnectError(err):
			code, status = "no_reachable_worker", http.StatusServiceUnavailable
		}
		rec.fail(w, status, "server_error", code, "", "the engine holding the response failed: "+err.Error(), 0)
	}
}

// instance returns the local engine worker with instance id, nil when the
// pool has none (it stopped, or it is not healthy now).
func (g *Gateway) instance(id string) *scoring.Worker {
	for _, wk := range g.cfg.Pool.All() {
		if wk.ID == id && wk.Upstream == "" {
			return wk
		}
	}
	return nil
}

// relayStored sends r as it came (method, path, query; no body) to wk and
// relays the answer, flushing each read (a resumed event stream), within
// the model's response_header and stream_idle timeouts. It returns an error
// only when nothing reached the client.
func (g *Gateway) relayStored(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome,
	wk *scoring.Worker, reqID string) error {
	to := g.cfg.Policy.Current().For(wk.Model).Timeouts
	uctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := newUpstreamTimer(cancel, to.ResponseHeader)
	defer timer.t.Stop()
	up, err := http.NewRequestWithContext(uctx, r.Method, "http://"+wk.Address+r.URL.RequestURI(), http.NoBody)
	if err != nil {
		return err
	}
	up.Header = towardEngine(r.Header, 3)
	delete(up.Header, "Content-Length")
	up.Header["Accept-Encoding"] = identityEncoding
	up.Header.Set("X-Request-Id", reqID)
	g.markHop(up, r)
	resp, err := g.cfg.Transport.RoundTrip(up)
	if err != nil {
		if c := context.Cause(uctx); errors.Is(c, errResponseHeaderTimeout) {
			return c
		}
		return err
	}
	defer resp.Body.Close()
	timer.streaming(to.StreamIdle)
	if resp.StatusCode >= 400 {
		g.engineError(&call{ctx: ctx, w: w, r: r, rec: rec, x: &exchange{reqID: reqID}}, resp)
		return nil
	}
	copyEndToEnd(w.Header(), resp.Header)
	w.Header().Set("X-Request-Id", reqID)
	w.WriteHeader(resp.StatusCode)
	rec.status = resp.StatusCode
	rec.firstByte(time.Now())
	fl, _ := w.(http.Flusher)
	bp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bp)
	for {
		n, rerr := resp.Body.Read(*bp)
		timer.streaming(to.StreamIdle)
		if n > 0 {
			if _, werr := w.Write((*bp)[:n]); werr != nil {
				return nil // the client left
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			g.log.Warn("stored response relay broke", "worker", wk.ID, "request_id", reqID, "error", rerr,
				"cause", context.Cause(uctx))
			return nil
		}
	}
}
