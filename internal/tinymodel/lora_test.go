package tinymodel

import (
	"bytes"
	"testing"

	"github.com/shoenig/test/must"
)

// TestWriteLoRAReadsBack: the adapter is a GGUF llama.cpp loads as a LoRA
// of the model Write makes with the same options: its type keys and, per
// layer, lora_a (in × rank) and lora_b (rank × out) for attn_q and attn_v;
// the same seed gives the same bytes.
func TestWriteLoRAReadsBack(t *testing.T) {
	o := Options{Layers: 2, Embd: 8, Heads: 2, KVHeads: 1, Seed: 3}
	var buf, again bytes.Buffer
	must.NoError(t, WriteLoRA(&buf, o, 4))
	must.NoError(t, WriteLoRA(&again, o, 4))
	must.Eq(t, buf.Bytes(), again.Bytes())
	f, err := Read(bytes.NewReader(buf.Bytes()))
	must.NoError(t, err)
	must.Eq[any](t, "adapter", f.Get("general.type"))
	must.Eq[any](t, "lora", f.Get("adapter.type"))
	must.Eq[any](t, "llama", f.Get("general.architecture"))
	must.Eq[any](t, float32(4), f.Get("adapter.lora.alpha"))
	must.Len(t, 2*2*2, f.Tensors)
	must.Eq(t, TensorInfo{Name: "blk.0.attn_q.weight.lora_a", Dims: []uint64{8, 4}, Type: TensorF32}, f.Tensors[0])
	must.Eq(t, TensorInfo{Name: "blk.0.attn_q.weight.lora_b", Dims: []uint64{4, 8}, Type: TensorF32}, f.Tensors[1])
	must.Eq(t, TensorInfo{Name: "blk.0.attn_v.weight.lora_b", Dims: []uint64{4, 4}, Type: TensorF32}, f.Tensors[3])

	must.Error(t, WriteLoRA(&buf, o, 0))
}
