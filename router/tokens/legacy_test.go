package tokens

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/shoenig/test/must"
)

// legacyOutputs are what Sim, Bytes and Engine's /tokenize request were for
// each body when tokenizers decoded the whole body themselves (commit
// 28bb1b0): tokenizing the prompt openai.ParseRequest finds must give the
// same ids, and the same request to the engine.
var legacyOutputs = []struct {
	name, path, body string
	sim, bytes       []uint32
	payload          string // the /tokenize body, equal as JSON
}{
	{
		name: "chat string", path: "/v1/chat/completions",
		body:    `{"model":"sim-model","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, world!"}]}`,
		sim:     []uint32{16843008, 16843010, 7633523, 7693933, 16843011, 2826, 5927029, 2187890, 101, 2192741, 7566437, 46, 16843012, 16843010, 7763045, 114, 16843011, 2826, 4810348, 28015, 44, 2193519, 7564644, 33, 16843012, 16843010, 6452339, 6976628, 6451060, 16843011, 2826},
		bytes:   []uint32{1937339252, 1701642329, 1869946977, 1919230068, 1701999461, 771782003, 1701969992, 1701604463, 740325231, 1919706145, 0},
		payload: `{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, world!"}],"model":"sim-model"}`,
	},
	{
		name: "chat content parts", path: "/v1/chat/completions",
		body:    `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b c"}]}]}`,
		sim:     []uint32{16843008, 16843010, 7763045, 114, 16843011, 2826, 97, 10, 98, 8547, 16843012, 16843010, 6452339, 6976628, 6451060, 16843011, 2826},
		bytes:   []uint32{1970496882, 6359650, 2122496},
		payload: `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b c"}]}],"model":"sim-model"}`,
	},
	{
		name: "chat no generation prompt", path: "/v1/chat/completions",
		body:    `{"model":"sim-model","add_generation_prompt":false,"messages":[{"role":"user","content":"x y z"}]}`,
		sim:     []uint32{16843008, 16843010, 7763045, 114, 16843011, 2826, 120, 8569, 8570, 16843012},
		bytes:   []uint32{1970496882, 7872633, 2128384},
		payload: `{"add_generation_prompt":false,"messages":[{"role":"user","content":"x y z"}],"model":"sim-model"}`,
	},
	{
		name: "chat generation prompt null", path: "/v1/chat/completions",
		body:    `{"model":"sim-model","add_generation_prompt":null,"messages":[{"role":"user","content":"x y z"}]}`,
		sim:     []uint32{16843008, 16843010, 7763045, 114, 16843011, 2826, 120, 8569, 8570, 16843012, 16843010, 6452339, 6976628, 6451060, 16843011, 2826},
		bytes:   []uint32{1970496882, 7872633, 2128384},
		payload: `{"messages":[{"role":"user","content":"x y z"}],"model":"sim-model"}`,
	},
	{
		name: "chat no special tokens", path: "/v1/chat/completions",
		body:    `{"model":"sim-model","add_special_tokens":false,"add_generation_prompt":true,"messages":[{"role":"user","content":"x y z"}]}`,
		sim:     []uint32{16843008, 16843010, 7763045, 114, 16843011, 2826, 120, 8569, 8570, 16843012, 16843010, 6452339, 6976628, 6451060, 16843011, 2826},
		bytes:   []uint32{1970496882, 7872633, 2128384},
		payload: `{"add_generation_prompt":true,"add_special_tokens":false,"messages":[{"role":"user","content":"x y z"}],"model":"sim-model"}`,
	},
	{
		name: "chat escapes and spacing", path: "/v1/chat/completions",
		body:    `{"model":"sim-model", "messages" : [ {"role":"user", "content":"caf\u00e9 \"q\" <b>&\n"} ] , "stream":true}`,
		sim:     []uint32{16843008, 16843010, 7763045, 114, 16843011, 2826, 6578790, 50345, 8482, 113, 34, 8508, 98, 16166, 10, 16843012, 16843010, 6452339, 6976628, 6451060, 16843011, 2826},
		bytes:   []uint32{1970496882, 6512998, 3282640930, 1898061884, 1648240138, 0},
		payload: `{"messages":[{"role":"user","content":"caf\u00e9 \"q\" \u003cb\u003e\u0026\n"}],"model":"sim-model"}`,
	},
	{
		name: "completion string", path: "/v1/completions",
		body:    `{"model":"sim-model","prompt":"Once upon a time"}`,
		sim:     []uint32{16843008, 5271395, 101, 2193008, 28782, 8545, 2192745, 28261},
		bytes:   []uint32{575630947, 1696626032, 1869488225, 544500077, 25890},
		payload: `{"model":"sim-model","prompt":"Once upon a time"}`,
	},
	{
		name: "completion no special tokens", path: "/v1/completions",
		body:    `{"model":"sim-model","prompt":"Once upon a time","add_special_tokens":false}`,
		sim:     []uint32{5271395, 101, 2193008, 28782, 8545, 2192745, 28261},
		bytes:   []uint32{575630947, 1696626032, 1869488225, 544500077, 25890},
		payload: `{"add_special_tokens":false,"model":"sim-model","prompt":"Once upon a time"}`,
	},
	{
		name: "completion ids", path: "/v1/completions",
		body:    `{"model":"sim-model","prompt":[ 101, 7, 4096 ]}`,
		sim:     []uint32{101, 7, 4096},
		bytes:   []uint32{1528836400, 824975415, 740308016, 959848541},
		payload: `{"model":"sim-model","prompt":[101,7,4096]}`,
	},
	{
		name: "completion batch of one string", path: "/v1/completions",
		body:    `{"model":"sim-model","prompt":["Once upon a time"]}`,
		sim:     []uint32{16843008, 5271395, 101, 2193008, 28782, 8545, 2192745, 28261},
		bytes:   []uint32{1528975214, 1667571829, 1886350880, 1629516905, 1835344477},
		payload: `{"model":"sim-model","prompt":["Once upon a time"]}`,
	},
	{
		name: "completion batch of one string no special", path: "/v1/completions",
		body:    `{"model":"sim-model","prompt":["Once upon a time"],"add_special_tokens":false}`,
		sim:     []uint32{5271395, 101, 2193008, 28782, 8545, 2192745, 28261},
		bytes:   []uint32{1528975214, 1667571829, 1886350880, 1629516905, 1835344477},
		payload: `{"add_special_tokens":false,"model":"sim-model","prompt":["Once upon a time"]}`,
	},
	{
		name: "completion batch of one ids", path: "/v1/completions",
		body:    `{"model":"sim-model","prompt":[[5,6,7]]}`,
		sim:     []uint32{5, 6, 7},
		bytes:   []uint32{1532704044, 908867421, 93},
		payload: `{"model":"sim-model","prompt":[[5,6,7]]}`,
	},
	{
		name: "completion escapes", path: "/v1/completions",
		body:    `{"model":"sim-model","prompt":"caf\u00e9 \"q\"\ttab"}`,
		sim:     []uint32{16843008, 6578790, 50345, 8482, 113, 34, 9, 7692898},
		bytes:   []uint32{576938342, 1551183920, 1698242652, 577854498, 1551135841, 25122},
		payload: `{"model":"sim-model","prompt":"caf\u00e9 \"q\"\ttab"}`,
	},
}

func TestTokenizersKeepLegacyOutputs(t *testing.T) {
	for _, tc := range legacyOutputs {
		t.Run(tc.name, func(t *testing.T) {
			p := promptOf(t, tc.path, tc.body)
			sim, err := Sim{}.Tokenize(context.Background(), "sim-model", p)
			must.NoError(t, err)
			must.Eq(t, tc.sim, sim)
			byt, err := Bytes{}.Tokenize(context.Background(), "sim-model", p)
			must.NoError(t, err)
			must.Eq(t, tc.bytes, byt)

			var got, want any
			must.NoError(t, json.Unmarshal(tokenizePayload("sim-model", p), &got))
			must.NoError(t, json.Unmarshal([]byte(tc.payload), &want))
			must.Eq(t, want, got)
		})
	}
}

func TestTokenizePayload(t *testing.T) {
	for _, tc := range []struct{ name, model, path, body, want string }{
		{"chat raw as sent", "m", "/v1/chat/completions", `{"model":"m","messages": [ {"role":"user","content":"<hi>"} ] }`,
			`{"model":"m","messages":[ {"role":"user","content":"<hi>"} ]}`},
		{"chat flags", "m", "/v1/chat/completions", `{"model":"m","messages":[],"add_generation_prompt":false,"add_special_tokens":true}`,
			`{"model":"m","messages":[],"add_generation_prompt":false,"add_special_tokens":true}`},
		{"completion drops add_generation_prompt", "m", "/v1/completions", `{"model":"m","prompt":[1],"add_generation_prompt":false,"add_special_tokens":null}`,
			`{"model":"m","prompt":[1]}`},
		{"model quoted", "a\"b\\c\u00e9\n", "/v1/completions", `{"model":"x","prompt":"p"}`,
			`{"model":"a\"b\\cé\n","prompt":"p"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tokenizePayload(tc.model, promptOf(t, tc.path, tc.body))
			must.Eq(t, tc.want, string(got))
			must.True(t, json.Valid(got))
		})
	}
}
