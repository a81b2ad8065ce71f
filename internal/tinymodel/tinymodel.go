// Package tinymodel writes a tiny Llama-architecture GGUF model that llama.cpp's
// llama-server loads and serves: seeded random weights, a real tokenizer copied from a
// vocabulary-only GGUF (llama.cpp's models/ggml-vocab-llama-bpe.gguf is Llama 3's) and a
// chat template embedded as tokenizer.chat_template.
//
// Its answers are noise, but everything around them is real: tokenization, the chat
// template, the KV cache (several layers, real KV heads), slots, timings and metrics.
//
// One trap is handled here: llama-server's output parser answers 500 when a completion
// holds a special token or a byte token that is not whole UTF-8 (random weights pick
// them as readily as any other). The output projection's rows of every token that is
// not a normal token whose bytes are valid UTF-8 are zero, so their logits stay 0 while
// the others spread over ±tens: the model never samples them.
package tinymodel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"unicode/utf8"
)

// Options shape the model. The zero value of a field takes its default.
type Options struct {
	Name      string // general.name; default "oasis-tiny-llama"
	Layers    int    // default 4
	Embd      int    // hidden size; default 64
	Heads     int    // attention heads; default 4
	KVHeads   int    // KV heads (grouped-query attention); default 2
	FF        int    // feed-forward size; default 128
	Context   int    // training context length; default 4096
	Seed      uint64 // the weights' seed; the same seed gives the same bytes
	ChatTmpl  string // tokenizer.chat_template; empty: none
	F32Output bool   // token embedding and output in F32 instead of F16 (twice the size)
}

func (o *Options) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Layers, 4)
	def(&o.Embd, 64)
	def(&o.Heads, 4)
	def(&o.KVHeads, 2)
	def(&o.FF, 128)
	def(&o.Context, 4096)
	if o.Name == "" {
		o.Name = "oasis-tiny-llama"
	}
}

// Token types of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
const tokenNormal = 1

// ReadVocab reads the tokenizer.* keys of a GGUF file (a vocabulary-only GGUF or any model).
func ReadVocab(path string) ([]KV, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	f, err := Read(fh)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []KV
	for _, kv := range f.KVs {
		if len(kv.Key) > 10 && kv.Key[:10] == "tokenizer." && kv.Key != "tokenizer.chat_template" {
			out = append(out, kv)
		}
	}
	return out, nil
}

// Write writes the model to w, with the tokenizer keys vocab (from ReadVocab).
func Write(w io.Writer, vocab []KV, o Options) error {
	o.defaults()
	if o.Embd%o.Heads != 0 || o.Heads%o.KVHeads != 0 {
		return fmt.Errorf("tinymodel: %d heads do not divide %d or %d KV heads do not divide them", o.Heads, o.Embd, o.KVHeads)
	}
	var tokens []string
	var types []int32
	for _, kv := range vocab {
		switch kv.Key {
		case "tokenizer.ggml.tokens":
			tokens, _ = kv.Value.([]string)
		case "tokenizer.ggml.token_type":
			types, _ = kv.Value.([]int32)
		}
	}
	if len(tokens) == 0 {
		return errors.New("tinymodel: the vocabulary has no tokenizer.ggml.tokens")
	}
	if types != nil && len(types) != len(tokens) {
		return fmt.Errorf("tinymodel: %d token types for %d tokens", len(types), len(tokens))
	}
	sampleable := make([]bool, len(tokens))
	byteLevel := false
	for _, kv := range vocab {
		if kv.Key == "tokenizer.ggml.model" && kv.Value == "gpt2" {
			byteLevel = true
		}
	}
	for i, t := range tokens {
		if types != nil && types[i] != tokenNormal {
			continue
		}
		if byteLevel {
			b, ok := decodeByteLevel(t)
			sampleable[i] = ok && utf8.Valid(b)
		} else {
			sampleable[i] = utf8.ValidString(t)
		}
	}

	nVocab, nEmbd, headDim := uint64(len(tokens)), uint64(o.Embd), uint64(o.Embd/o.Heads)
	nKV := headDim * uint64(o.KVHeads)
	f := &File{KVs: []KV{
		{"general.architecture", "llama"},
		{"general.name", o.Name},
		{"general.file_type", uint32(1)}, // mostly F16
		{"llama.vocab_size", uint32(nVocab)},
		{"llama.context_length", uint32(o.Context)},
		{"llama.embedding_length", uint32(o.Embd)},
		{"llama.block_count", uint32(o.Layers)},
		{"llama.feed_forward_length", uint32(o.FF)},
		{"llama.attention.head_count", uint32(o.Heads)},
		{"llama.attention.head_count_kv", uint32(o.KVHeads)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.dimension_count", uint32(headDim)},
		{"llama.rope.freq_base", float32(500000)},
	}}
	f.KVs = append(f.KVs, vocab...)
	if o.ChatTmpl != "" {
		f.KVs = append(f.KVs, KV{"tokenizer.chat_template", o.ChatTmpl})
	}

	big := TensorF16
	if o.F32Output {
		big = TensorF32
	}
	type gen struct {
		std  float64 // N(0, std); 0: all ones
		zero []bool  // rows (Dims[1] index) set to zero
	}
	var gens []gen
	add := func(name string, typ uint32, g gen, dims ...uint64) {
		f.Tensors = append(f.Tensors, TensorInfo{Name: name, Dims: dims, Type: typ})
		gens = append(gens, g)
	}
	add("token_embd.weight", big, gen{std: 1}, nEmbd, nVocab)
	for l := 0; l < o.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		in := 1 / math.Sqrt(float64(nEmbd))
		add(p+"attn_norm.weight", TensorF32, gen{}, nEmbd)
		add(p+"attn_q.weight", TensorF16, gen{std: in}, nEmbd, nEmbd)
		add(p+"attn_k.weight", TensorF16, gen{std: in}, nEmbd, nKV)
		add(p+"attn_v.weight", TensorF16, gen{std: in}, nEmbd, nKV)
		add(p+"attn_output.weight", TensorF16, gen{std: in}, nEmbd, nEmbd)
		add(p+"ffn_norm.weight", TensorF32, gen{}, nEmbd)
		add(p+"ffn_gate.weight", TensorF16, gen{std: in}, nEmbd, uint64(o.FF))
		add(p+"ffn_up.weight", TensorF16, gen{std: in}, nEmbd, uint64(o.FF))
		add(p+"ffn_down.weight", TensorF16, gen{std: 1 / math.Sqrt(float64(o.FF))}, uint64(o.FF), nEmbd)
	}
	add("output_norm.weight", TensorF32, gen{}, nEmbd)
	zero := make([]bool, nVocab)
	for i, ok := range sampleable {
		zero[i] = !ok
	}
	add("output.weight", big, gen{std: 1, zero: zero}, nEmbd, nVocab)

	rng := rand.New(rand.NewPCG(o.Seed, 0x0a515))
	buf := make([]byte, 0, 1<<16)
	return write(w, f, func(i int, w io.Writer) error {
		t, g := f.Tensors[i], gens[i]
		rowLen := t.Dims[0]
		rows := t.Bytes() / rowLen
		if t.Type == TensorF16 {
			rows /= 2
		} else {
			rows /= 4
		}
		for r := uint64(0); r < rows; r++ {
			buf = buf[:0]
			zeroRow := g.zero != nil && g.zero[r]
			for c := uint64(0); c < rowLen; c++ {
				v := float32(1)
				switch {
				case zeroRow:
					v = 0
				case g.std != 0:
					v = float32(rng.NormFloat64() * g.std)
				}
				if t.Type == TensorF16 {
					buf = binary.LittleEndian.AppendUint16(buf, f16(v))
				} else {
					buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
				}
			}
			if _, err := w.Write(buf); err != nil {
				return err
			}
		}
		return nil
	})
}

// byteDecoder maps the characters of GPT-2's byte-level BPE alphabet back to bytes
// (the inverse of bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
// others are shifted to U+0100 and up in byte order).
var byteDecoder = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			m[rune(b)] = byte(b)
		} else {
			m[rune(256+n)] = byte(b)
			n++
		}
	}
	return m
}()

// decodeByteLevel returns the bytes a byte-level BPE token stands for; false when it
// holds a character outside the alphabet (a special token's spelling).
func decodeByteLevel(tok string) ([]byte, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := byteDecoder[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}

// Paths inside llama.cpp's source tree (scripts/hashistack.sh links it as bin/llama.cpp).
const (
	VocabPath    = "models/ggml-vocab-llama-bpe.gguf"                        // Llama 3's tokenizer
	TemplatePath = "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja" // Llama 3.1's chat template
)

// WriteFile writes the model to path with Llama 3's vocabulary and Llama 3.1's chat
// template from the llama.cpp source tree src (o.ChatTmpl, when set, replaces the template).
// It writes a temporary file and renames it, so a reader never sees half a model.
func WriteFile(path, src string, o Options) error {
	vocab, err := ReadVocab(filepath.Join(src, VocabPath))
	if err != nil {
		return err
	}
	if o.ChatTmpl == "" {
		t, err := os.ReadFile(filepath.Join(src, TemplatePath))
		if err != nil {
			return err
		}
		o.ChatTmpl = string(t)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tinymodel-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := Write(tmp, vocab, o); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// Readable by the engine's user, whoever runs it (CreateTemp makes 0600).
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
