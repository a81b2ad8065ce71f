package tokenizer

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestRoundTrip(t *testing.T) {
	cases := []string{
		"",
		"a",
		"hello world",
		"  leading spaces and trailing  ",
		"tabs\tand\nnew\n\nlines\r\n",
		"punctuation!?... (x) <|not special|> <|",
		"unicode: héllo wörld — 日本語 🙂",
		"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
		"<|<|eot_id|>|>",
	}
	for _, s := range cases {
		ids := Encode(nil, s)
		for _, id := range ids {
			must.True(t, Valid(id))
		}
		must.Eq(t, s, Decode(ids, false))
	}
}

func TestPieces(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"hello world", []string{"hel", "lo", " wo", "rld"}},
		{"a, b", []string{"a", ",", " b"}},
		{"x\n\n  y", []string{"x", "\n\n", " ", " y"}},
		{"<|eot_id|>ok", []string{"<|eot_id|>", "ok"}},
	}
	for _, c := range cases {
		ids := Encode(nil, c.in)
		got := make([]string, len(ids))
		for i, id := range ids {
			got[i] = string(TokenBytes(id))
		}
		must.Eq(t, c.want, got, must.Sprintf("input %q", c.in))
	}
}

func TestSpecial(t *testing.T) {
	ids := Encode(nil, "<|begin_of_text|>a<|eot_id|>")
	must.Eq(t, []int32{BOS, 'a', EOT}, ids)
	must.True(t, IsSpecial(BOS))
	must.False(t, IsSpecial('a'))
	must.Eq(t, "a", Decode(ids, true))
	must.Eq(t, append([]int32{BOS}, Encode(nil, "hi")...), EncodePrompt("hi"))
}

func TestDeterministicAndPrefixStable(t *testing.T) {
	// A prompt that extends another at a piece boundary keeps the first prompt's ids as
	// a prefix: what prefix caching relies on.
	a := EncodePrompt("You are a helpful assistant.")
	b := EncodePrompt("You are a helpful assistant. Tell me a joke.")
	must.Eq(t, a, b[:len(a)])
	must.Eq(t, a, EncodePrompt("You are a helpful assistant."))
}

func TestChat(t *testing.T) {
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}
	s := RenderChat(msgs, true)
	must.Eq(t, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"+
		"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"+
		"<|start_header_id|>assistant<|end_header_id|>\n\n", s)
	ids := EncodeChat(msgs, true)
	must.Eq(t, BOS, ids[0])
	must.Eq(t, s, Decode(ids, false))
	must.Eq(t, Encode(nil, s), ids)
}

func TestTokenString(t *testing.T) {
	must.Eq(t, " wo", TokenString(Encode(nil, " wo")[0]))
	ids := Encode(nil, "日") // 3 bytes: one token, valid UTF-8
	must.Eq(t, "日", TokenString(ids[0]))
	ids = Encode(nil, "é!") // é is 2 bytes, own piece? no: é is a word byte run
	must.Eq(t, "é", TokenString(ids[0]))
	ids = Encode(nil, "éé") // 4 bytes: "é\xc3" then "\xa9"
	must.Eq(t, `bytes:\xa9`, TokenString(ids[1]))
}

func BenchmarkEncode(b *testing.B) {
	s := "The quick brown fox jumps over the lazy dog, again and again; 1234567890. "
	for len(s) < 4096 {
		s += s
	}
	b.SetBytes(int64(len(s)))
	dst := make([]int32, 0, len(s))
	for b.Loop() {
		dst = Encode(dst[:0], s)
	}
}

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", "hello world", "<|eot_id|>x<|", "\n\n  a", "日本 🙂", "<|begin_of_text|><|"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := Encode(nil, s)
		for _, id := range ids {
			if !Valid(id) {
				t.Fatalf("invalid id %d", id)
			}
		}
		if got := Decode(ids, false); got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
	})
}
