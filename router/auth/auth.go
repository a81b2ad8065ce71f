// Package auth checks API keys and applies per-key rate limits. Keys are
// stored only as SHA-256 digests; the presented key is hashed and looked up.
// Nothing here logs a key or its digest.
package auth

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// File is the key set document, from a file or Consul KV:
//
//	{"keys": [{"id": "team-a", "sha256": "<64 hex>", "rate_per_second": 10, "burst": 20,
//	           "tokens_per_minute": 100000, "priority": 1, "models": ["llama-3-8b"]}]}
//
// rate_per_second and tokens_per_minute 0 mean unlimited; priority 0–9,
// higher served first from a full admission queue; models, when set, are
// the only model names (engines' served names, adapters, cascade aliases)
// the key may use. Create a digest with `printf %s "$KEY" | sha256sum`.
type File struct {
	Keys []KeySpec `json:"keys"`
}

// KeySpec is one accepted key.
type KeySpec struct {
	ID            string  `json:"id"`
	SHA256        string  `json:"sha256"`
	RatePerSecond float64 `json:"rate_per_second,omitempty"`
	Burst         float64 `json:"burst,omitempty"`
	// TokensPerMinute bounds prompt + completion tokens (from the engines'
	// usage) a minute; a request is refused while the key is in debt.
	TokensPerMinute float64 `json:"tokens_per_minute,omitempty"`
	// Priority is the key's admission band, 0 (default) to MaxPriority.
	Priority int `json:"priority,omitempty"`
	// Models, when set, are the only models the key may use (at most
	// MaxKeyModels names); empty: every model.
	Models []string `json:"models,omitempty"`
}

// equal reports whether two specs say the same.
func (s KeySpec) equal(o KeySpec) bool {
	return s.ID == o.ID && s.SHA256 == o.SHA256 && s.RatePerSecond == o.RatePerSecond && s.Burst == o.Burst &&
		s.TokensPerMinute == o.TokensPerMinute && s.Priority == o.Priority && slices.Equal(s.Models, o.Models)
}

// MaxKeyModels bounds a key's models list, and maxModelName each name.
const (
	MaxKeyModels = 256
	maxModelName = 256
)

// MaxPriority is the highest priority band a key may have.
const MaxPriority = 9

// Key is an authenticated caller.
type Key struct {
	ID   string
	spec KeySpec
	lim  *rate.Limiter // nil: unlimited; at the key's share of its limits

	attempts atomic.Int64  // Allow calls since the last Demand
	rate     atomic.Uint64 // requests a second (float64 bits), Demand's estimate
	mu       sync.Mutex    // serialises the limiter's resizing and the quota
	frac     float64       // the share lim is sized for (0: the whole limit)
	quota    tokenQuota    // tokens_per_minute, under mu
}

// Priority is the key's admission band (KeySpec.Priority).
func (k *Key) Priority() int { return k.spec.Priority }

// Allows reports whether the key may use model (KeySpec.Models).
func (k *Key) Allows(model string) bool {
	return len(k.spec.Models) == 0 || slices.Contains(k.spec.Models, model)
}

// Errors.
var (
	ErrMissingKey = errors.New("missing API key: send Authorization: Bearer <key>")
	ErrBadKey     = errors.New("invalid API key")
)

// Parse decodes and validates a key set.
func Parse(data []byte) (map[[32]byte]KeySpec, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decoding API keys: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("decoding API keys: data after the document")
	}
	out := make(map[[32]byte]KeySpec, len(f.Keys))
	ids := map[string]bool{}
	for i, k := range f.Keys {
		if k.ID == "" {
			return nil, fmt.Errorf("keys[%d].id: missing", i)
		}
		if ids[k.ID] {
			return nil, fmt.Errorf("keys[%d].id: duplicate %q", i, k.ID)
		}
		ids[k.ID] = true
		raw, err := hex.DecodeString(k.SHA256)
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("keys[%d].sha256: want 64 hex digits (sha256 of the key)", i)
		}
		if k.RatePerSecond < 0 || math.IsNaN(k.RatePerSecond) || math.IsInf(k.RatePerSecond, 0) {
			return nil, fmt.Errorf("keys[%d].rate_per_second: must be ≥ 0", i)
		}
		if k.Burst < 0 || math.IsNaN(k.Burst) || math.IsInf(k.Burst, 0) {
			return nil, fmt.Errorf("keys[%d].burst: must be ≥ 0", i)
		}
		if k.TokensPerMinute < 0 || math.IsNaN(k.TokensPerMinute) || math.IsInf(k.TokensPerMinute, 0) {
			return nil, fmt.Errorf("keys[%d].tokens_per_minute: must be ≥ 0", i)
		}
		if k.Priority < 0 || k.Priority > MaxPriority {
			return nil, fmt.Errorf("keys[%d].priority: want 0 to %d, got %d", i, MaxPriority, k.Priority)
		}
		if err := checkModels(k.Models); err != nil {
			return nil, fmt.Errorf("keys[%d].models: %w", i, err)
		}
		var d [32]byte
		copy(d[:], raw)
		if _, dup := out[d]; dup {
			return nil, fmt.Errorf("keys[%d].sha256: same digest as another key", i)
		}
		out[d] = k
	}
	return out, nil
}

// checkModels validates a key's models list: bounded, names non-empty and
// bounded, no duplicates.
func checkModels(models []string) error {
	if len(models) > MaxKeyModels {
		return fmt.Errorf("at most %d models, got %d", MaxKeyModels, len(models))
	}
	seen := make(map[string]bool, len(models))
	for j, m := range models {
		switch {
		case m == "" || len(m) > maxModelName:
			return fmt.Errorf("[%d]: want a model name of 1 to %d bytes", j, maxModelName)
		case seen[m]:
			return fmt.Errorf("[%d]: duplicate %q", j, m)
		}
		seen[m] = true
	}
	return nil
}

// Authenticator holds the current key set. With no key set loaded it refuses
// every request (enabled auth never fails open).
type Authenticator struct {
	keys atomic.Pointer[map[[32]byte]*Key]
	mu   sync.Mutex // serialises Set
	now  func() time.Time

	// Share, when set, is this router's part (0 to 1] of key id's limits
	// (peers.Peers.KeyFraction, which learns the rate this router sees the
	// key at from Demand): a key's rate and burst hold for the
	// datacenter. Set it before the first Allow.
	Share func(id string) float64
	// Tokens, when set, counts each key's tokens by key and kind (prompt,
	// completion); a key's series go when it leaves the key set, so the
	// key document bounds them. Set it before the first Set.
	Tokens *prometheus.CounterVec
	// demandAt is when Demand last ran.
	demandAt time.Time
}

// New returns an authenticator with no keys.
func New() *Authenticator {
	a := &Authenticator{now: time.Now}
	empty := map[[32]byte]*Key{}
	a.keys.Store(&empty)
	return a
}

// Set replaces the key set. Buckets of keys that stay (same id, digest and
// limits) keep their state, so a reload does not refill them.
func (a *Authenticator) Set(specs map[[32]byte]KeySpec) {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := *a.keys.Load()
	a.forgetSeries(old, specs)
	next := make(map[[32]byte]*Key, len(specs))
	for d, s := range specs {
		if k, ok := old[d]; ok && k.spec.equal(s) {
			next[d] = k
			continue
		}
		next[d] = &Key{ID: s.ID, spec: s, lim: newLimiter(s)}
	}
	a.keys.Store(&next)
}

// Len returns the number of keys loaded.
func (a *Authenticator) Len() int { return len(*a.keys.Load()) }

// Authenticate finds the caller's key from "Authorization: Bearer <key>".
func (a *Authenticator) Authenticate(r *http.Request) (*Key, error) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return nil, ErrMissingKey
	}
	d := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	k, ok := (*a.keys.Load())[d]
	if !ok {
		return nil, ErrBadKey
	}
	return k, nil
}

// Allow admits one request of k: while the key's tokens_per_minute quota is
// not in debt, it takes one token from its request bucket. When refused it
// returns false and how long until the request would be admitted.
func (a *Authenticator) Allow(k *Key) (bool, time.Duration) {
	if k.lim == nil && k.spec.TokensPerMinute == 0 {
		return true, 0
	}
	k.attempts.Add(1)
	now := a.now()
	f := a.share(k)
	if k.spec.TokensPerMinute > 0 {
		k.mu.Lock()
		ok, wait := k.quota.allow(now, k.spec.TokensPerMinute*f)
		k.mu.Unlock()
		if !ok {
			return false, wait
		}
	}
	if k.lim == nil {
		return true, 0
	}
	a.resize(k, now, f)
	r := k.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now) // refused: the token stays for the next caller
		return false, d
	}
	return true, 0
}

// AddUsage counts a request's tokens, from the engine's usage, against k's
// quota and in Tokens.
func (a *Authenticator) AddUsage(k *Key, prompt, completion int64) {
	prompt, completion = max(prompt, 0), max(completion, 0)
	if a.Tokens != nil {
		a.Tokens.WithLabelValues(k.ID, "prompt").Add(float64(prompt))
		a.Tokens.WithLabelValues(k.ID, "completion").Add(float64(completion))
	}
	if k.spec.TokensPerMinute > 0 {
		now := a.now()
		f := a.share(k)
		k.mu.Lock()
		k.quota.use(now, k.spec.TokensPerMinute*f, float64(prompt+completion))
		k.mu.Unlock()
	}
}

// share is this router's part of k's limits (1 without Share).
func (a *Authenticator) share(k *Key) float64 {
	if a.Share == nil {
		return 1
	}
	f := a.Share(k.ID)
	if f <= 0 || f > 1 || math.IsNaN(f) {
		return 1
	}
	return f
}

// forgetSeries removes the Tokens series of keys not in next. Caller holds
// a.mu.
func (a *Authenticator) forgetSeries(old map[[32]byte]*Key, next map[[32]byte]KeySpec) {
	if a.Tokens == nil {
		return
	}
	stay := make(map[string]bool, len(next))
	for _, s := range next {
		stay[s.ID] = true
	}
	for _, k := range old {
		if !stay[k.ID] {
			a.Tokens.DeletePartialMatch(prometheus.Labels{"key": k.ID})
		}
	}
}

// newLimiter is s's token bucket (golang.org/x/time/rate): rate_per_second
// tokens a second up to burst (default: one second's worth, at least 1),
// starting full; nil when unlimited.
func newLimiter(s KeySpec) *rate.Limiter {
	if s.RatePerSecond == 0 {
		return nil
	}
	burst := s.Burst
	if burst < 1 {
		burst = math.Max(1, s.RatePerSecond)
	}
	return rate.NewLimiter(rate.Limit(s.RatePerSecond), int(math.Min(burst, math.MaxInt32)))
}

// resize sets k's bucket to this router's share f of the key's limits:
// rate × f, burst × f (at least 1, so that a key is never refused outright
// here: the rounding is the overshoot of a burst, one request per router).
// The bucket is resized only when the share moved by more than 1%.
func (a *Authenticator) resize(k *Key, now time.Time, f float64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.frac != 0 && math.Abs(f-k.frac) <= 0.01*k.frac {
		return
	}
	k.frac = f
	full := newLimiter(k.spec)
	k.lim.SetLimitAt(now, full.Limit()*rate.Limit(f))
	k.lim.SetBurstAt(now, max(1, int(float64(full.Burst())*f)))
}

// Demand is the rate each rate-limited key is asked at here, requests a
// second since the previous call (smoothed by half), for the datacenter's
// other routers; keys not asked lately are left out. Call it from one
// goroutine (the peers' loop).
func (a *Authenticator) Demand() map[string]float64 {
	now := a.now()
	elapsed := now.Sub(a.demandAt).Seconds()
	first := a.demandAt.IsZero()
	a.demandAt = now
	out := map[string]float64{}
	for _, k := range *a.keys.Load() {
		if k.lim == nil && k.spec.TokensPerMinute == 0 {
			continue
		}
		n := float64(k.attempts.Swap(0))
		r := math.Float64frombits(k.rate.Load())
		if !first && elapsed > 0 {
			r = (r + n/elapsed) / 2
		}
		if r < 0.01 {
			r = 0
		}
		k.rate.Store(math.Float64bits(r))
		if r > 0 {
			out[k.ID] = r
		}
	}
	return out
}

// tokenQuota is a key's tokens_per_minute: a bucket of perMin tokens that
// refills at perMin a minute, charged after the fact from usage (it may go
// into debt: a request's size is known only at its end). Callers hold the
// key's mu.
type tokenQuota struct {
	tokens float64
	at     time.Time
}

func (q *tokenQuota) refill(now time.Time, perMin float64) {
	if q.at.IsZero() {
		q.tokens, q.at = perMin, now
		return
	}
	if d := now.Sub(q.at).Seconds(); d > 0 {
		q.tokens += perMin / 60 * d
		q.at = now
	}
	q.tokens = min(q.tokens, perMin)
}

// allow reports whether the quota is not in debt, else how long until it
// is not.
func (q *tokenQuota) allow(now time.Time, perMin float64) (bool, time.Duration) {
	q.refill(now, perMin)
	if q.tokens > 0 {
		return true, 0
	}
	sec := (1 - q.tokens) / (perMin / 60)
	return false, time.Duration(sec * float64(time.Second))
}

func (q *tokenQuota) use(now time.Time, perMin, n float64) {
	q.refill(now, perMin)
	q.tokens -= n
}
