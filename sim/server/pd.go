package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
)

// Disaggregated prefill/decode. A prefill leg computes the prompt and its engine keeps
// the prompt's KV blocks (engine.Request.HoldKV) under a key: the vLLM request id it
// returns in kv_transfer_params, or the SGLang bootstrap room. The decode engine pulls
// them over the prefill engine's side channel (HTTP, POST SideChannelPath), waits the
// transfer time (KV bytes / link bandwidth, scaled by --speed) and decodes with the
// prompt counted as computed. The side channel is oasis-sim's own: real engines move
// the bytes with NIXL or Mooncake; only the handshake shapes are theirs.

// SideChannelPath is the side channel's pull endpoint.
const SideChannelPath = "/oasis-sim/kv/pull"

// Policies for a failed KV load, vLLM's kv_load_failure_policy
// (vllm/config/kv_transfer.py: "recompute" or "fail", default "fail").
const (
	PolicyFail      = "fail"
	PolicyRecompute = "recompute"
)

// SGLang's --disaggregation-mode values oasis-sim models.
const (
	ModePrefill = "prefill"
	ModeDecode  = "decode"
)

// PDConfig configures disaggregated prefill/decode. Zero fields take the defaults
// below.
type PDConfig struct {
	// EngineID is this engine's remote_engine_id (vLLM's kv_transfer_config engine_id);
	// default a random id.
	EngineID string
	// SideChannelHost and SideChannelPort are what vLLM-style prefill legs report as
	// remote_host / remote_port (vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST/PORT). The caller
	// serves SideChannel() there (and on SGLang's bootstrap port).
	SideChannelHost string
	SideChannelPort int
	// LoadFailurePolicy is PolicyFail (default, as vLLM) or PolicyRecompute.
	LoadFailurePolicy string
	// SGLangMode is SGLang's --disaggregation-mode: "", ModePrefill or ModeDecode.
	SGLangMode string
	// LinkBytesPerSec is the KV link bandwidth; default 50e9 (one 400 Gb/s RDMA NIC).
	LinkBytesPerSec float64
	// BytesPerToken is the KV size of one token; default 131072 (Llama-3-8B BF16:
	// 32 layers × 8 KV heads × 128 dims × 2 (K,V) × 2 bytes).
	BytesPerToken int
	// HoldTimeout frees held KV nobody pulled; default 480 s (vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
	HoldTimeout time.Duration
	// WaitTimeout bounds an SGLang decode leg's wait for its room; default 300 s
	// (SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT).
	WaitTimeout time.Duration
}

func (c *PDConfig) fill() error {
	if c.EngineID == "" {
		c.EngineID = fmt.Sprintf("oasis-sim-%016x", rand.Uint64())
	}
	switch c.LoadFailurePolicy {
	case "":
		c.LoadFailurePolicy = PolicyFail
	case PolicyFail, PolicyRecompute:
	default:
		return fmt.Errorf("kv load failure policy %q: must be %q or %q", c.LoadFailurePolicy, PolicyFail, PolicyRecompute)
	}
	switch c.SGLangMode {
	case "", ModePrefill, ModeDecode:
	default:
		return fmt.Errorf("disaggregation mode %q: must be %q or %q", c.SGLangMode, ModePrefill, ModeDecode)
	}
	if c.LinkBytesPerSec == 0 {
		c.LinkBytesPerSec = 50e9
	}
	if c.BytesPerToken == 0 {
		c.BytesPerToken = 128 << 10
	}
	if c.HoldTimeout == 0 {
		c.HoldTimeout = 480 * time.Second
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = 300 * time.Second
	}
	if c.LinkBytesPerSec < 0 || c.BytesPerToken < 0 || c.HoldTimeout < 0 || c.WaitTimeout < 0 {
		return errors.New("kv transfer parameters must not be negative")
	}
	return nil
}

// heldKV is a finished prefill leg's KV, waiting for its decode leg.
type heldKV struct {
	streamID   string // the engine request holding the blocks
	engineID   string
	blocks     []int32
	tokens     int
	promptHash uint64
	timer      *time.Timer
}

// kvStore holds prefill legs' KV by key ("req:"+vLLM request id, "room:"+SGLang room).
type kvStore struct {
	mu      sync.Mutex
	held    map[string]*heldKV
	changed chan struct{} // closed and replaced on every put
}

func newKVStore() *kvStore {
	return &kvStore{held: map[string]*heldKV{}, changed: make(chan struct{})}
}

func roomKey(room int64) string { return "room:" + strconv.FormatInt(room, 10) }
func reqKey(id string) string   { return "req:" + id }

func keyOf(r pullRequest) string {
	if r.RoomSet {
		return roomKey(r.Room)
	}
	return reqKey(r.RequestID)
}

// holdKV registers a finished prefill leg's blocks under key; they are freed when
// pulled or after HoldTimeout. It returns the block ids.
func (s *Server) holdKV(key string, st *stream, prompt []int32) []int32 {
	s.mu.Lock()
	blocks, ok := s.eng.HeldBlocks(st.id)
	s.mu.Unlock()
	if !ok {
		return []int32{}
	}
	h := &heldKV{streamID: st.id, engineID: s.cfg.PD.EngineID, blocks: blocks, tokens: len(prompt), promptHash: promptHash(prompt)}
	ks := s.kv
	ks.mu.Lock()
	old := ks.held[key]
	ks.held[key] = h
	h.timer = time.AfterFunc(s.cfg.PD.HoldTimeout, func() {
		if s.dropHeld(key, h) {
			s.metrics.kvFailures.WithLabelValues("expired").Inc()
		}
	})
	close(ks.changed)
	ks.changed = make(chan struct{})
	ks.mu.Unlock()
	if old != nil {
		s.dropHeld(key, old) // a reused room: the older KV is gone
	}
	return blocks
}

// dropHeld unregisters h from key (if it is still there) and frees its blocks. It
// reports whether h was registered: of concurrent pulls and the expiry, one wins.
func (s *Server) dropHeld(key string, h *heldKV) bool {
	ks := s.kv
	ks.mu.Lock()
	registered := ks.held[key] == h
	if registered {
		delete(ks.held, key)
	}
	ks.mu.Unlock()
	h.timer.Stop()
	s.mu.Lock()
	s.eng.ReleaseHeld(h.streamID)
	s.mu.Unlock()
	return registered
}

// waitHeld returns the KV under key, waiting up to wait for a prefill leg to put it.
func (s *Server) waitHeld(ctx context.Context, key string, wait time.Duration) *heldKV {
	t := time.NewTimer(wait)
	defer t.Stop()
	ks := s.kv
	for {
		ks.mu.Lock()
		h, changed := ks.held[key], ks.changed
		ks.mu.Unlock()
		if h != nil || wait <= 0 {
			return h
		}
		select {
		case <-changed:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

func promptHash(prompt []int32) uint64 {
	var h uint64 = 1469598103934665603
	for _, t := range prompt {
		h = (h ^ uint64(uint32(t))) * 1099511628211
	}
	return h
}

// pullRequest and pullResponse are the side channel's JSON.
type pullRequest struct {
	EngineID   string  `json:"engine_id,omitempty"`
	RequestID  string  `json:"request_id,omitempty"`
	BlockIDs   []int32 `json:"block_ids,omitempty"`
	Room       int64   `json:"room,omitempty"`
	RoomSet    bool    `json:"room_set,omitempty"`
	PromptHash string  `json:"prompt_hash"`
	WaitMS     int64   `json:"wait_ms,omitempty"`
}

type pullResponse struct {
	NumTokens     int    `json:"num_tokens"`
	NumBlocks     int    `json:"num_blocks"`
	BlockSize     int    `json:"block_size"`
	BytesPerToken int    `json:"bytes_per_token"`
	Reason        string `json:"reason,omitempty"`
}

// SideChannel serves other engines' pulls of this engine's held KV: vLLM's NIXL side
// channel and SGLang's bootstrap server in one.
func (s *Server) SideChannel() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+SideChannelPath, s.handlePull)
	return mux
}

func (s *Server) handlePull(w http.ResponseWriter, r *http.Request) {
	var req pullRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		writeJSON(w, pullResponse{Reason: "invalid_request"})
		return
	}
	wait := min(time.Duration(req.WaitMS)*time.Millisecond, s.cfg.PD.WaitTimeout)
	key := keyOf(req)
	h := s.waitHeld(r.Context(), key, wait)
	reason := ""
	switch {
	case h == nil:
		reason = "not_found"
	case req.EngineID != "" && req.EngineID != h.engineID:
		reason = "not_found" // another engine's request ids (a restarted prefill engine)
	case strconv.FormatUint(h.promptHash, 16) != req.PromptHash || (!req.RoomSet && !slices.Equal(req.BlockIDs, h.blocks)):
		reason = "mismatch"
	}
	if reason == "" && !s.dropHeld(key, h) {
		reason = "not_found" // another pull took it, or it expired meanwhile
	}
	if reason != "" {
		w.WriteHeader(http.StatusNotFound)
		writeJSON(w, pullResponse{Reason: reason})
		return
	}
	// The decode engine has the blocks: the prefill engine frees them (vLLM's
	// finished_sending).
	bs := s.eng.Config().BlockSize
	s.metrics.kvBlocks.WithLabelValues("sent").Add(float64(len(h.blocks)))
	writeJSON(w, pullResponse{NumTokens: h.tokens, NumBlocks: len(h.blocks), BlockSize: bs, BytesPerToken: s.cfg.PD.BytesPerToken})
}

// kvLoadError is a failed pull; reason labels oasis_sim_kv_transfer_failures_total.
type kvLoadError struct {
	reason string
	err    error
}

func (e *kvLoadError) Error() string {
	return fmt.Sprintf("KV transfer failed (%s): %v", e.reason, e.err)
}

// pullKV fetches held KV from addr ("host:port") and waits out its transfer time.
// It returns the number of prompt tokens received.
func (s *Server) pullKV(ctx context.Context, addr string, req pullRequest) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(req.WaitMS)*time.Millisecond+10*time.Second)
	defer cancel()
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+SideChannelPath, bytes.NewReader(body))
	if err != nil {
		return 0, &kvLoadError{"unreachable", err}
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(hr)
	if err != nil {
		return 0, &kvLoadError{"unreachable", err}
	}
	defer resp.Body.Close()
	var pr pullResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&pr); err != nil {
		return 0, &kvLoadError{"invalid_response", err}
	}
	if resp.StatusCode != http.StatusOK {
		if pr.Reason == "" {
			pr.Reason = "invalid_response"
		}
		return 0, &kvLoadError{pr.Reason, fmt.Errorf("side channel %s answered %d", addr, resp.StatusCode)}
	}
	if pr.NumBlocks < 0 || pr.BlockSize < 0 || pr.BytesPerToken < 0 || pr.NumTokens < 0 {
		return 0, &kvLoadError{"invalid_response", errors.New("negative sizes")}
	}
	size := float64(pr.NumBlocks) * float64(pr.BlockSize) * float64(pr.BytesPerToken)
	d := time.Duration(size / s.cfg.PD.LinkBytesPerSec * float64(time.Second))
	if err := s.sleepSim(ctx, d); err != nil {
		return 0, &kvLoadError{"aborted", err}
	}
	s.metrics.kvSeconds.Observe(d.Seconds())
	s.metrics.kvBlocks.WithLabelValues("received").Add(float64(pr.NumBlocks))
	return pr.NumTokens, nil
}

// sleepSim waits a simulated duration in real time (d / speed; no wait at speed 0).
func (s *Server) sleepSim(ctx context.Context, d time.Duration) error {
	if s.cfg.Speed <= 0 || d <= 0 {
		return nil
	}
	return ctxsleep.Sleep(ctx, time.Duration(float64(d)/s.cfg.Speed))
}

// receiveKV runs a decode leg's KV load before it is scheduled. It reports whether
// the prompt arrived from the prefill engine; an error is the HTTP answer.
func (s *Server) receiveKV(ctx context.Context, p *prepared) (bool, error) {
	var (
		addr string
		req  = pullRequest{PromptHash: strconv.FormatUint(promptHash(p.prompt), 16)}
	)
	switch {
	case p.vllm != nil && p.vllm.remotePrefill && s.cfg.KVTransfer:
		addr = net.JoinHostPort(p.vllm.host, strconv.Itoa(p.vllm.port))
		req.EngineID, req.RequestID, req.BlockIDs = p.vllm.engineID, p.vllm.requestID, p.vllm.blockIDs
	case p.sglang != nil && s.cfg.PD.SGLangMode == ModeDecode:
		addr = p.sglang.addr()
		req.Room, req.RoomSet = p.sglang.room, true
		req.WaitMS = s.cfg.PD.WaitTimeout.Milliseconds()
	default:
		return false, nil
	}
	n, err := s.pullKV(ctx, addr, req)
	if err == nil && n < len(p.prompt)-1 {
		err = &kvLoadError{"mismatch", fmt.Errorf("received %d tokens for a %d-token prompt", n, len(p.prompt))}
	}
	if err == nil {
		return true, nil
	}
	var le *kvLoadError
	if !errors.As(err, &le) {
		le = &kvLoadError{"unreachable", err}
	}
	if le.reason == "aborted" {
		return false, err
	}
	s.metrics.kvFailures.WithLabelValues(le.reason).Inc()
	// vLLM: kv_load_failure_policy "recompute" reschedules the request to compute the
	// blocks, "fail" finishes it with an error. SGLang's decode aborts a request whose
	// transfer failed with HTTP 500 (python/sglang/srt/disaggregation/decode.py,
	// pop_transferred: prepare_abort(..., status_code=INTERNAL_SERVER_ERROR)).
	if p.vllm != nil && s.cfg.PD.LoadFailurePolicy == PolicyRecompute {
		s.log.Debug("KV load failed, recomputing the prompt", "error", err)
		return false, nil
	}
	return false, &apiError{status: http.StatusInternalServerError, typ: "InternalServerError", msg: err.Error()}
}
