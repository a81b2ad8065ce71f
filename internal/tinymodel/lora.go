package tinymodel

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
)

// WriteLoRA writes a LoRA adapter for the model Write makes with o: rank-r
// lora_a/lora_b pairs (F32, random, seeded by o.Seed) on every layer's
// attn_q and attn_v, as llama.cpp's convert_lora_to_gguf.py lays them out
// (general.type "adapter", adapter.type "lora"). Its words are noise too,
// but other noise than the base model's: a test tells whether an engine
// applied it from the text.
func WriteLoRA(w io.Writer, o Options, r int) error {
	o.defaults()
	if r <= 0 || o.Embd%o.Heads != 0 {
		return fmt.Errorf("tinymodel: LoRA rank %d, %d heads for %d embedding", r, o.Heads, o.Embd)
	}
	nEmbd, rank := uint64(o.Embd), uint64(r)
	nKV := uint64(o.Embd/o.Heads) * uint64(o.KVHeads)
	f := &File{KVs: []KV{
		{"general.architecture", "llama"},
		{"general.type", "adapter"},
		{"general.name", o.Name + "-lora"},
		{"adapter.type", "lora"},
		{"adapter.lora.alpha", float32(r)},
	}}
	for l := 0; l < o.Layers; l++ {
		for _, m := range []struct {
			name string
			out  uint64
		}{{"attn_q", nEmbd}, {"attn_v", nKV}} {
			p := fmt.Sprintf("blk.%d.%s.weight", l, m.name)
			f.Tensors = append(f.Tensors,
				TensorInfo{Name: p + ".lora_a", Dims: []uint64{nEmbd, rank}, Type: TensorF32},
				TensorInfo{Name: p + ".lora_b", Dims: []uint64{rank, m.out}, Type: TensorF32})
		}
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x10a))
	return write(w, f, func(i int, w io.Writer) error {
		n := f.Tensors[i].Bytes() / 4
		buf := make([]byte, 0, 4*n)
		for range n {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(float32(rng.NormFloat64())))
		}
		_, err := w.Write(buf)
		return err
	})
}

// WriteLoRAFile writes WriteLoRA's adapter to path.
func WriteLoRAFile(path string, o Options, r int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteLoRA(f, o, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
