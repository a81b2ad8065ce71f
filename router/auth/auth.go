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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// File is the key set document, from a file or Consul KV:
//
//	{"keys": [{"id": "team-a", "sha256": "<64 hex>", "rate_per_second": 10, "burst": 20}]}
//
// rate_per_second 0 means unlimited. Create a digest with
// `printf %s "$KEY" | sha256sum`.
type File struct {
	Keys []KeySpec `json:"keys"`
}

// KeySpec is one accepted key.
type KeySpec struct {
	ID            string  `json:"id"`
	SHA256        string  `json:"sha256"`
	RatePerSecond float64 `json:"rate_per_second,omitempty"`
	Burst         float64 `json:"burst,omitempty"`
}

// Key is an authenticated caller.
type Key struct {
	ID  string
	lim *rate.Limiter // nil: unlimited
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
		var d [32]byte
		copy(d[:], raw)
		if _, dup := out[d]; dup {
			return nil, fmt.Errorf("keys[%d].sha256: same digest as another key", i)
		}
		out[d] = k
	}
	return out, nil
}

// Authenticator holds the current key set. With no key set loaded it refuses
// every request (enabled auth never fails open).
type Authenticator struct {
	keys atomic.Pointer[map[[32]byte]*Key]
	mu   sync.Mutex // serialises Set
	now  func() time.Time
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
	next := make(map[[32]byte]*Key, len(specs))
	for d, s := range specs {
		if k, ok := old[d]; ok && k.ID == s.ID && sameLimit(k.lim, newLimiter(s)) {
			next[d] = k
			continue
		}
		next[d] = &Key{ID: s.ID, lim: newLimiter(s)}
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

// Allow takes one token from the key's bucket. When empty it returns false
// and how long until a token is available.
func (a *Authenticator) Allow(k *Key) (bool, time.Duration) {
	if k.lim == nil {
		return true, 0
	}
	now := a.now()
	r := k.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now) // refused: the token stays for the next caller
		return false, d
	}
	return true, 0
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

func sameLimit(a, b *rate.Limiter) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Limit() == b.Limit() && a.Burst() == b.Burst()
}
