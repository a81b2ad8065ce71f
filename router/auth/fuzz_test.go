package auth

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"
)

// FuzzParse feeds arbitrary API-key documents (a file or Consul KV) to Parse.
// Beyond never panicking: an accepted set holds only keys with a non-empty,
// unique id, a digest that is the map key's 32 bytes in hex, and finite limits
// ≥ 0; and it survives a JSON round trip unchanged (the set the router would
// write back or show is the set it enforces).
func FuzzParse(f *testing.F) {
	d1, d2 := digest("k"), digest("j")
	for _, s := range []string{
		fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q,"rate_per_second":5,"burst":10}]}`, d1),
		fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q},{"id":"b","sha256":%q,"rate_per_second":0.5}]}`, d1, d2),
		fmt.Sprintf(`{"keys":[{"id":"a","sha256":%q},{"id":"a","sha256":%q}]}`, d1, d2),
		`{"keys":[{"id":"a","sha256":"ABCDEF0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789"}]}`,
		`{"keys":[{"id":"a","sha256":"sk-live-123"}]}`,
		`{"keys":[],"extra":1}`,
		`{"keys":null}`,
		`{"keys":[]} []`,
		`{"keys":[{"id":"a","sha256":"00","rate_per_second":1e400}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := Parse(data)
		if err != nil {
			if set != nil {
				t.Fatalf("Parse returned keys and an error %v", err)
			}
			return
		}
		ids := map[string]bool{}
		doc := File{Keys: []KeySpec{}}
		for d, k := range set {
			if k.ID == "" || ids[k.ID] {
				t.Fatalf("accepted empty or duplicate id %q", k.ID)
			}
			ids[k.ID] = true
			raw, err := hex.DecodeString(k.SHA256)
			if err != nil || len(raw) != len(d) || string(raw) != string(d[:]) {
				t.Fatalf("key %q: digest %q is not the map key %x", k.ID, k.SHA256, d)
			}
			for _, v := range []float64{k.RatePerSecond, k.Burst} {
				if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("key %q: accepted limit %v", k.ID, v)
				}
			}
			doc.Keys = append(doc.Keys, k)
		}
		js, err := json.Marshal(doc)
		if err != nil {
			t.Fatalf("accepted set does not encode: %v", err)
		}
		again, err := Parse(js)
		if err != nil {
			t.Fatalf("re-encoded set %s does not parse: %v", js, err)
		}
		if !reflect.DeepEqual(set, again) {
			t.Fatalf("round trip changed the set:\n%v\n%v", set, again)
		}
	})
}
