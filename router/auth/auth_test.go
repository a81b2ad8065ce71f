package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/metrics"
)

func digest(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

func TestParse(t *testing.T) {
	good := digest("k")
	cases := []struct {
		name, doc, err string
	}{
		{"ok", fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"rate_per_second":5,"burst":10}]}`, good), ""},
		{"short digest", `{"keys":[{"id":"a","sha256":"abcd"}]}`, "keys[0].sha256"},
		{"plain key instead of digest", `{"keys":[{"id":"a","sha256":"sk-live-123"}]}`, "keys[0].sha256"},
		{"missing id", fmt.Sprintf(`{"keys":[{"sha256":%q}]}`, good), "keys[0].id"},
		{"duplicate id", fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q},{"id":"a","sha256":%q}]}`, good, digest("j")), "keys[1].id"},
		{"duplicate digest", fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q},{"id":"b","sha256":%q}]}`, good, good), "keys[1].sha256"},
		{"negative rate", fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"rate_per_second":-1}]}`, good), "rate_per_second"},
		{"unknown field", `{"keys":[],"extra":1}`, "unknown field"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if tc.err == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, tc.err)
			must.StrNotContains(t, err.Error(), "sk-live-123") // never echo key material
		})
	}
}

func TestAuthenticateAndBucket(t *testing.T) {
	specs, err := Parse([]byte(fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"rate_per_second":2,"burst":2},{"id":"free","sha256":%q}]}`,
		digest("key-a"), digest("key-free"))))
	must.NoError(t, err)
	a := New()
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	a.Set(specs)
	req := func(h string) *http.Request {
		r, _ := http.NewRequest("GET", "/", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		return r
	}
	_, err = a.Authenticate(req(""))
	must.ErrorIs(t, err, ErrMissingKey)
	_, err = a.Authenticate(req("Bearer nope"))
	must.ErrorIs(t, err, ErrBadKey)
	_, err = a.Authenticate(req("Basic key-a"))
	must.ErrorIs(t, err, ErrMissingKey)
	k, err := a.Authenticate(req("Bearer key-a"))
	must.NoError(t, err)
	must.Eq(t, "a", k.ID)

	ok, _ := a.Allow(k)
	must.True(t, ok)
	ok, _ = a.Allow(k)
	must.True(t, ok)
	ok, wait := a.Allow(k)
	must.False(t, ok)
	must.Eq(t, 500*time.Millisecond, wait)
	now = now.Add(500 * time.Millisecond)
	ok, _ = a.Allow(k)
	must.True(t, ok)

	// A reload with the same limits keeps the (empty) bucket.
	a.Set(specs)
	k2, _ := a.Authenticate(req("Bearer key-a"))
	ok, _ = a.Allow(k2)
	must.False(t, ok)

	free, err := a.Authenticate(req("Bearer key-free"))
	must.NoError(t, err)
	for range 100 {
		ok, _ := a.Allow(free)
		must.True(t, ok)
	}
	// An empty key set refuses everyone.
	a.Set(nil)
	_, err = a.Authenticate(req("Bearer key-a"))
	must.ErrorIs(t, err, ErrBadKey)
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/keys.json"
	a := New()
	must.Error(t, a.LoadFile(path)) // missing file
	must.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q}]}`, digest("k1"))), 0o600))
	must.NoError(t, a.LoadFile(path))
	must.Eq(t, 1, a.Len())
	// A bad file leaves the loaded keys in place.
	must.NoError(t, os.WriteFile(path, []byte(`{"keys":[{"id":"a","sha256":"k1"}]}`), 0o600))
	must.Error(t, a.LoadFile(path))
	r, _ := http.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer k1")
	k, err := a.Authenticate(r)
	must.NoError(t, err)
	must.Eq(t, "a", k.ID)
}

// With Share, a key's bucket is this router's part of its limits, and
// Demand reports the rate the key is asked at here.
func TestShareSplitsBucket(t *testing.T) {
	specs, err := Parse([]byte(fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"rate_per_second":30,"burst":30}]}`, digest("key-a"))))
	must.NoError(t, err)
	a := New()
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	frac := 1.0 / 3
	a.Share = func(id string) float64 { must.Eq(t, "a", id); return frac }
	a.Set(specs)
	r, _ := http.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer key-a")
	k, err := a.Authenticate(r)
	must.NoError(t, err)
	admitted := 0
	for range 30 {
		if ok, _ := a.Allow(k); ok {
			admitted++
		}
	}
	must.Eq(t, 10, admitted, must.Sprint("a third of the burst"))
	now = now.Add(time.Second)
	admitted = 0
	for range 30 {
		if ok, _ := a.Allow(k); ok {
			admitted++
		}
	}
	must.Eq(t, 10, admitted, must.Sprint("a third of the rate"))

	a.Demand() // the first call starts the window
	now = now.Add(time.Second)
	for range 8 {
		a.Allow(k)
	}
	must.Eq(t, map[string]float64{"a": 4}, a.Demand(), must.Sprint("8/s, smoothed by half from 0"))

	// The whole limit back: the bucket grows, without a gift of tokens
	// (10 saved at the old size), and fills at the whole rate.
	frac = 1
	now = now.Add(time.Second)
	for _, want := range []int{10, 30} {
		admitted = 0
		for range 40 {
			if ok, _ := a.Allow(k); ok {
				admitted++
			}
		}
		must.Eq(t, want, admitted)
		now = now.Add(time.Second)
	}
}

// tokens_per_minute: a key in debt from its usage is refused until the
// quota has refilled past zero; its tokens are counted per key, and a key
// that leaves the document takes its series along.
func TestTokensPerMinute(t *testing.T) {
	specs, err := Parse([]byte(fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"tokens_per_minute":600,"priority":3},{"id":"b","sha256":%q}]}`,
		digest("key-a"), digest("key-b"))))
	must.NoError(t, err)
	a := New()
	reg := prometheus.NewRegistry()
	a.Tokens = metrics.New(reg).KeyTokens
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	a.Set(specs)
	r, _ := http.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer key-a")
	k, err := a.Authenticate(r)
	must.NoError(t, err)
	must.Eq(t, 3, k.Priority())
	ok, _ := a.Allow(k)
	must.True(t, ok)
	a.AddUsage(k, 500, 150) // 50 tokens of debt
	ok, wait := a.Allow(k)
	must.False(t, ok)
	must.Eq(t, 5100*time.Millisecond, wait, must.Sprint("51 tokens at 10 a second"))
	now = now.Add(wait)
	ok, _ = a.Allow(k)
	must.True(t, ok)
	must.Eq(t, 500.0, promtest.ToFloat64(a.Tokens.WithLabelValues("a", "prompt")))
	must.Eq(t, 150.0, promtest.ToFloat64(a.Tokens.WithLabelValues("a", "completion")))

	// Shared over 3 routers, the quota is a third.
	a.Share = func(string) float64 { return 1.0 / 3 }
	now = now.Add(time.Minute)
	a.AddUsage(k, 200, 0)
	ok, _ = a.Allow(k)
	must.False(t, ok, must.Sprint("200 tokens of a 200-token share: no credit left"))

	a.Set(map[[32]byte]KeySpec{})
	must.Eq(t, 0, promtest.CollectAndCount(a.Tokens), must.Sprint("a's series went with a"))
}

func TestParseTenantFields(t *testing.T) {
	good := digest("k")
	for _, tc := range []struct{ doc, err string }{
		{fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"priority":10}]}`, good), "keys[0].priority"},
		{fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"priority":-1}]}`, good), "keys[0].priority"},
		{fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"tokens_per_minute":-5}]}`, good), "keys[0].tokens_per_minute"},
		{fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"models":["m",""]}]}`, good), "keys[0].models: [1]"},
		{fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"models":["m","m"]}]}`, good), `keys[0].models: [1]: duplicate "m"`},
		{fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"models":[%q]}]}`, good, strings.Repeat("x", 257)), "keys[0].models: [0]"},
		{fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"models":[%s"m"]}]}`, good, strings.Repeat(`"m",`, MaxKeyModels)), "keys[0].models: at most 256"},
	} {
		_, err := Parse([]byte(tc.doc))
		must.ErrorContains(t, err, tc.err)
	}
}
