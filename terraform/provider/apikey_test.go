package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/auth"
)

func TestValidateAPIKey(t *testing.T) {
	ok := apiKeyModel{KeyID: types.StringValue("team-a"), RatePerSecond: types.Float64Value(10), Burst: types.Float64Value(0)}
	for _, tc := range []struct {
		name  string
		edit  func(m *apiKeyModel)
		attrs []string // attributes named, none: valid
	}{
		{"valid", func(*apiKeyModel) {}, nil},
		{"limits unset", func(m *apiKeyModel) { m.RatePerSecond, m.Burst = types.Float64Null(), types.Float64Null() }, nil},
		{"unknown values", func(m *apiKeyModel) { m.KeyID, m.Burst = types.StringUnknown(), types.Float64Unknown() }, nil},
		{"dotted id", func(m *apiKeyModel) { m.KeyID = types.StringValue("svc.batch_2") }, nil},
		{"empty id", func(m *apiKeyModel) { m.KeyID = types.StringValue("") }, []string{"key_id"}},
		{"space in id", func(m *apiKeyModel) { m.KeyID = types.StringValue("team a") }, []string{"key_id"}},
		{"leading dash", func(m *apiKeyModel) { m.KeyID = types.StringValue("-a") }, []string{"key_id"}},
		{"long id", func(m *apiKeyModel) { m.KeyID = types.StringValue(strings.Repeat("a", 65)) }, []string{"key_id"}},
		{"negative rate", func(m *apiKeyModel) { m.RatePerSecond = types.Float64Value(-1) }, []string{"rate_per_second"}},
		{"infinite burst", func(m *apiKeyModel) { m.Burst = types.Float64Value(math.Inf(1)) }, []string{"burst"}},
		{"all bad", func(m *apiKeyModel) {
			m.KeyID, m.RatePerSecond, m.Burst = types.StringValue("ä"), types.Float64Value(-1), types.Float64Value(-2)
		}, []string{"key_id", "rate_per_second", "burst"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := ok
			tc.edit(&m)
			var attrs []string
			for _, e := range validateAPIKey(m) {
				attrs = append(attrs, e.attr)
			}
			must.Eq(t, tc.attrs, attrs)
		})
	}
}

func TestNewSecret(t *testing.T) {
	a, err := newSecret()
	must.NoError(t, err)
	b, err := newSecret()
	must.NoError(t, err)
	must.NotEq(t, a, b)
	must.StrHasPrefix(t, keySecretPrefix, a)
	must.Eq(t, len(keySecretPrefix)+43, len(a)) // 32 bytes, base64url without padding
	must.Eq(t, 64, len(digest(a)))
}

// authenticates checks with the router's authenticator that doc opens the
// router to each secret as its id, and to nothing else.
func authenticates(t *testing.T, doc string, secrets map[string]string) {
	t.Helper()
	specs, err := auth.Parse([]byte(doc))
	must.NoError(t, err)
	a := auth.New()
	a.Set(specs)
	try := func(secret string) (*auth.Key, error) {
		r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		r.Header.Set("Authorization", "Bearer "+secret)
		return a.Authenticate(r)
	}
	for id, secret := range secrets {
		k, err := try(secret)
		must.NoError(t, err)
		must.Eq(t, id, k.ID)
	}
	other, err := newSecret()
	must.NoError(t, err)
	_, err = try(other)
	must.ErrorIs(t, err, auth.ErrBadKey)
}

// keyDoc reads the key document below prefix.
func (b *testBed) keyDoc(t *testing.T, prefix string) map[string]auth.KeySpec {
	t.Helper()
	pair := kvValue(t, b.consul, prefix+"/keys")
	must.NotNil(t, pair)
	_, err := auth.Parse(pair.Value)
	must.NoError(t, err)
	var f auth.File
	must.NoError(t, json.Unmarshal(pair.Value, &f))
	out := map[string]auth.KeySpec{}
	for _, k := range f.Keys {
		out[k.ID] = k
	}
	return out
}

func (b *testBed) putKeyDoc(t *testing.T, prefix string, keys map[string]auth.KeySpec) {
	t.Helper()
	var f auth.File
	for _, k := range keys {
		f.Keys = append(f.Keys, k)
	}
	data, err := json.Marshal(f)
	must.NoError(t, err)
	kvPut(t, b.consul, prefix+"/keys", data)
}

// The api_key lifecycle through tofu: three keys share the document with an
// entry of someone else's; out-of-band changes show as an update (limits)
// or a replacement (digest) of exactly that key, a deleted entry as a
// create; import leaves the secret null; destroy leaves the other entry.
func (b *testBed) testAPIKeys(t *testing.T) {
	ctx := context.Background()
	const prefix = "t/keys"
	other := auth.KeySpec{ID: "other", SHA256: digest("someone else's"), RatePerSecond: 5}
	b.putKeyDoc(t, prefix, map[string]auth.KeySpec{"other": other})

	tf := b.tofu(t, "testdata/apikeys", prefix)
	out := tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	var secrets map[string]string
	must.NoError(t, tf.Output(ctx, "secrets", &secrets))
	doc := b.keyDoc(t, prefix)
	must.Eq(t, map[string]auth.KeySpec{
		"other":  other,
		"team-a": {ID: "team-a", SHA256: digest(secrets["a"]), RatePerSecond: 10, Burst: 20},
		"team-b": {ID: "team-b", SHA256: digest(secrets["b"])},
		"team-c": {ID: "team-c", SHA256: digest(secrets["c"]), RatePerSecond: 1},
	}, doc)
	raw := string(kvValue(t, b.consul, prefix+"/keys").Value)
	authenticates(t, raw, map[string]string{"team-a": secrets["a"], "team-b": secrets["b"], "team-c": secrets["c"]})
	for _, s := range secrets {
		must.StrHasPrefix(t, keySecretPrefix, s)
		must.StrNotContains(t, raw, s)
		must.StrNotContains(t, out, s)
	}

	p, err := tf.Plan(ctx)
	must.NoError(t, err)
	must.MapEmpty(t, addresses(p))

	// Out of band: team-a's rate and team-b's digest change.
	a, bb := doc["team-a"], doc["team-b"]
	a.RatePerSecond, bb.SHA256 = 99, digest("leaked")
	doc["team-a"], doc["team-b"] = a, bb
	b.putKeyDoc(t, prefix, doc)
	p, err = tf.Plan(ctx)
	must.NoError(t, err)
	must.Eq(t, map[string][]string{
		"oasis_api_key.a": {"update"},
		"oasis_api_key.b": {"delete", "create"},
	}, addresses(p))
	tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	must.NoError(t, tf.Output(ctx, "secrets", &secrets))
	doc = b.keyDoc(t, prefix)
	must.Eq(t, 10, doc["team-a"].RatePerSecond)
	must.Eq(t, digest(secrets["b"]), doc["team-b"].SHA256)

	// Out of band: team-c's entry is deleted.
	delete(doc, "team-c")
	b.putKeyDoc(t, prefix, doc)
	p, err = tf.Plan(ctx)
	must.NoError(t, err)
	must.Eq(t, map[string][]string{"oasis_api_key.c": {"create"}}, addresses(p))
	tf.Must(ctx, "apply", "-auto-approve", "-no-color")

	// Import by id: no change planned, the secret is unknown to state.
	tf.Must(ctx, "state", "rm", "oasis_api_key.a")
	tf.Must(ctx, "import", "-no-color", "oasis_api_key.a", "team-a")
	p, err = tf.Plan(ctx)
	must.NoError(t, err)
	must.MapEmpty(t, addresses(p))
	must.NoError(t, tf.Output(ctx, "secrets", &secrets))
	must.Eq(t, "", secrets["a"]) // null

	// Bad values fail plan, naming the attribute.
	_, err = tf.Run(ctx, "plan", "-no-color", "-var", "key_a=team a")
	must.ErrorContains(t, err, "key_id: want 1-64")
	_, err = tf.Run(ctx, "plan", "-no-color", "-var", "rate_a=-1")
	must.ErrorContains(t, err, "rate_per_second: must be a finite number ≥ 0")

	tf.Must(ctx, "destroy", "-auto-approve", "-no-color")
	must.Eq(t, map[string]auth.KeySpec{"other": other}, b.keyDoc(t, prefix))

	// A create never takes over an entry it did not make.
	taken := auth.KeySpec{ID: "team-a", SHA256: digest("theirs")}
	b.putKeyDoc(t, prefix, map[string]auth.KeySpec{"other": other, "team-a": taken})
	_, err = tf.Run(ctx, "apply", "-auto-approve", "-no-color")
	must.ErrorContains(t, err, `key "team-a" already exists in t/keys/keys: import it`)
	must.Eq(t, taken, b.keyDoc(t, prefix)["team-a"])
	tf.Must(ctx, "destroy", "-auto-approve", "-no-color")
	must.Eq(t, map[string]auth.KeySpec{"other": other, "team-a": taken}, b.keyDoc(t, prefix))
}

// Concurrent changes to the shared key document all land: each writer
// retries its check-and-set until it wins.
func (b *testBed) testAPIKeysConcurrent(t *testing.T) {
	ctx := context.Background()
	c := &Clients{Consul: b.consul, KVPrefix: "t/concurrent"}
	const n = 12
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = c.updateKeys(ctx, func(f *auth.File) error {
				f.Keys = append(f.Keys, auth.KeySpec{ID: fmt.Sprintf("k%d", i), SHA256: digest(fmt.Sprint(i))})
				return nil
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		must.NoError(t, err)
	}
	must.MapLen(t, n, b.keyDoc(t, "t/concurrent"))

	// Removing every entry, concurrently too, deletes the document: the
	// router reads a missing document as no keys.
	for i := range n {
		wg.Go(func() {
			errs[i] = c.updateKeys(ctx, func(f *auth.File) error {
				f.Keys = slices.DeleteFunc(f.Keys, func(k auth.KeySpec) bool { return k.ID == fmt.Sprintf("k%d", i) })
				return nil
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		must.NoError(t, err)
	}
	pair, _, err := b.consul.KV().Get(c.keysKey(), nil)
	must.NoError(t, err)
	must.Nil(t, pair)
}
