package openai

import (
	"encoding/json"
	"maps"
	"reflect"
	"testing"
)

// Issue #33 item 3: the disaggregation members a client sends are noticed
// by the parse and removed, every other member kept byte for byte.
func TestWithoutRouterOwned(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m"}`, `{"model":"m"}`},
		{` {"model" : "m" , "x":[1, 2]} `, ` {"model" : "m" , "x":[1, 2]} `}, // nothing to remove: the same bytes
		{`{"model":"m","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.9","remote_block_ids":[1,2]}}`,
			`{"model":"m"}`},
		{`{"kv_transfer_params":null,"model":"m", "messages":[{"role":"user","content":"a<b"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"a<b"}]}`},
		{`{"model":"m","bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":42,"stream":true}`,
			`{"model":"m","stream":true}`},
		{`{"bootstrap_room":1,"bootstrap_room":2}`, `{}`},
		{`{"model":"m","bootstrap_pair_key":"k","disagg_prefill_dp_rank":1,"decode_tp_size":8}`, `{"model":"m"}`},
		{"{\"kv\\u005ftransfer_params\":{},\"model\":\"m\"}\n", "{\"model\":\"m\"}\n"},               // escaped key
		{`{"model":"m","Kv_Transfer_Params":1}`, `{"model":"m","Kv_Transfer_Params":1}`},             // keys match exactly
		{`{"model":"m","x":{"kv_transfer_params":1}}`, `{"model":"m","x":{"kv_transfer_params":1}}`}, // top level only
	} {
		f, err := ParseRequest(chatPath, []byte(tc.in))
		if err != nil && tc.want != `{}` {
			t.Fatalf("ParseRequest(%s): %v", tc.in, err)
		}
		got, err := WithoutRouterOwned([]byte(tc.in))
		if err != nil {
			t.Fatalf("WithoutRouterOwned(%s): %v", tc.in, err)
		}
		if string(got) != tc.want {
			t.Errorf("WithoutRouterOwned(%s) = %s, want %s", tc.in, got, tc.want)
		}
		if owned := tc.in != tc.want; f.RouterOwned != owned && tc.want != `{}` {
			t.Errorf("ParseRequest(%s).RouterOwned = %v, want %v", tc.in, f.RouterOwned, owned)
		}
	}
	for _, bad := range []string{`{"model":`, `[1]`, ``, `{"a":1}x`} {
		if _, err := WithoutRouterOwned([]byte(bad)); err == nil {
			t.Errorf("WithoutRouterOwned(%q) accepted", bad)
		}
	}
}

// FuzzWithoutRouterOwned checks the removal against encoding/json: the
// result of a valid object is valid and holds exactly its other members.
func FuzzWithoutRouterOwned(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"model":"m","kv_transfer_params":{"a":[1]},"bootstrap_room":3}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := WithoutRouterOwned(body)
		var want map[string]json.RawMessage
		if json.Unmarshal(body, &want) != nil || want == nil {
			if err == nil {
				t.Fatalf("accepted %q", body)
			}
			return
		}
		if err != nil {
			t.Fatalf("refused %q: %v", body, err)
		}
		maps.DeleteFunc(want, func(k string, _ json.RawMessage) bool { return RouterOwned(k) })
		var have map[string]json.RawMessage
		if err := json.Unmarshal(got, &have); err != nil {
			t.Fatalf("result %q of %q is not JSON: %v", got, body, err)
		}
		if !reflect.DeepEqual(want, have) {
			t.Fatalf("WithoutRouterOwned(%q) = %q", body, got)
		}
	})
}
