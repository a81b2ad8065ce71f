package tinymodel

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"testing"

	"github.com/shoenig/test/must"
)

// vocab is a small byte-level vocabulary: normal tokens, a byte token that is half
// a UTF-8 sequence, and a control token.
func vocab() []KV {
	return []KV{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", "llama-bpe"},
		{"tokenizer.ggml.tokens", []string{"a", "Ġhello", "Ã", "<|eot_id|>", "Ã©"}},
		{"tokenizer.ggml.token_type", []int32{1, 1, 1, 3, 1}},
		{"tokenizer.ggml.merges", []string{"Ġ h"}},
		{"tokenizer.ggml.eos_token_id", uint32(3)},
	}
}

func TestWriteReadsBack(t *testing.T) {
	var buf bytes.Buffer
	o := Options{Layers: 2, Embd: 8, Heads: 2, KVHeads: 1, FF: 16, Seed: 7, ChatTmpl: "{{ messages }}"}
	must.NoError(t, Write(&buf, vocab(), o))
	f, err := Read(bytes.NewReader(buf.Bytes()))
	must.NoError(t, err)
	must.Eq(t, any("llama"), f.Get("general.architecture"))
	must.Eq(t, any(uint32(2)), f.Get("llama.block_count"))
	must.Eq(t, any(uint32(4)), f.Get("llama.rope.dimension_count"))
	must.Eq(t, any("{{ messages }}"), f.Get("tokenizer.chat_template"))
	must.Eq(t, any([]string{"Ġ h"}), f.Get("tokenizer.ggml.merges"))
	must.Len(t, 2+2*9+1, f.Tensors)

	// The data section: aligned, every tensor in order, and nothing after the last.
	var size uint64
	for _, ti := range f.Tensors {
		size = alignUp(size + ti.Bytes())
	}
	must.Eq(t, uint64(buf.Len())%ggufAlignment, 0)
	dataStart := uint64(buf.Len()) - size
	must.Eq(t, dataStart%ggufAlignment, 0)

	// output.weight: the rows of the control token and of the half UTF-8 byte "Ã"
	// (0xC3) are zero; "Ã©" (é, whole UTF-8) is not.
	out := f.Tensors[len(f.Tensors)-1]
	must.Eq(t, "output.weight", out.Name)
	var off uint64
	for _, ti := range f.Tensors[:len(f.Tensors)-1] {
		off = alignUp(off + ti.Bytes())
	}
	data := buf.Bytes()[dataStart+off:]
	for row, wantZero := range []bool{false, false, true, true, false} {
		zero := true
		for c := 0; c < 8; c++ {
			if binary.LittleEndian.Uint16(data[(row*8+c)*2:]) != 0 {
				zero = false
			}
		}
		must.Eq(t, wantZero, zero, must.Sprintf("row %d", row))
	}

	// The same seed gives the same bytes.
	var again bytes.Buffer
	must.NoError(t, Write(&again, vocab(), o))
	must.True(t, bytes.Equal(buf.Bytes(), again.Bytes()))
}

func TestReadVocabSkipsItsTemplate(t *testing.T) {
	var buf bytes.Buffer
	must.NoError(t, Write(&buf, vocab(), Options{Embd: 8, Heads: 2, KVHeads: 1, FF: 8, ChatTmpl: "x"}))
	f, err := Read(&buf)
	must.NoError(t, err)
	must.NotNil(t, f.Get("tokenizer.chat_template"))
	must.Eq(t, 6, len(tokenizerKeys(f)))
}

func tokenizerKeys(f *File) []KV {
	var out []KV
	for _, kv := range f.KVs {
		if len(kv.Key) > 10 && kv.Key[:10] == "tokenizer." && kv.Key != "tokenizer.chat_template" {
			out = append(out, kv)
		}
	}
	return out
}

func TestReadRefusesOtherFiles(t *testing.T) {
	_, err := Read(bytes.NewReader([]byte("GGML plus some bytes")))
	must.ErrorContains(t, err, "not a GGUF file")
	_, err = Read(io.LimitReader(bytes.NewReader([]byte{0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0}), 8))
	must.Error(t, err)
}

func TestF16(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {65504, 0x7bff}, {1e6, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00}, {5.960464477539063e-08, 0x0001}, {6.103515625e-05, 0x0400},
		{1e-9, 0}, {0.1, 0x2e66}, {3.14159, 0x4248},
	} {
		must.Eq(t, c.want, f16(c.in), must.Sprintf("f16(%g)", c.in))
	}
	must.Eq(t, uint16(0x7e00), f16(float32(math.NaN()))&0x7e00)
}

func TestDecodeByteLevel(t *testing.T) {
	b, ok := decodeByteLevel("Ġhello")
	must.True(t, ok)
	must.Eq(t, " hello", string(b))
	b, ok = decodeByteLevel("Ċ")
	must.True(t, ok)
	must.Eq(t, "\n", string(b))
	_, ok = decodeByteLevel("<|eot_id|>") // printable bytes: only its token_type marks it special
	must.True(t, ok)
	_, ok = decodeByteLevel("\u4e2d") // a character outside the byte alphabet
	must.False(t, ok)
}
