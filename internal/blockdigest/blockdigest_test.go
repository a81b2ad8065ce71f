package blockdigest

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"
	"lukechampine.com/blake3"
)

var update = flag.Bool("update", false, "rewrite testdata/vectors.json from the current implementation")

// vector is one checked-in test vector: inputs and the expected hex digests.
type vector struct {
	Name      string   `json:"name"`
	Model     string   `json:"model"`
	LoRA      string   `json:"lora,omitempty"`
	CacheSalt string   `json:"cache_salt,omitempty"`
	BlockSize int      `json:"block_size"`
	Parent    string   `json:"parent,omitempty"` // hex; empty means Root
	Tokens    []uint32 `json:"tokens"`
	Key       string   `json:"key"`     // hex domain key
	Digests   []string `json:"digests"` // hex, one per full block
}

func seq(n int, start uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = start + uint32(i)*7919
	}
	return out
}

func vectorInputs() []vector {
	return []vector{
		{Name: "one block of 4", Model: "m", BlockSize: 4, Tokens: []uint32{1, 2, 3, 4}},
		{Name: "three blocks and a partial tail", Model: "meta-llama/Llama-3.1-8B-Instruct", BlockSize: 4, Tokens: seq(14, 100)},
		{Name: "block size 16", Model: "Qwen/Qwen3-32B", BlockSize: 16, Tokens: seq(64, 151000)},
		{Name: "lora domain", Model: "Qwen/Qwen3-32B", LoRA: "sql-adapter", BlockSize: 16, Tokens: seq(64, 151000)},
		{Name: "salted domain", Model: "Qwen/Qwen3-32B", CacheSalt: "tenant-7", BlockSize: 16, Tokens: seq(64, 151000)},
		{Name: "max token ids", Model: "m", BlockSize: 2, Tokens: []uint32{0xffffffff, 0, 0x80000000, 1}},
		{Name: "extend from a parent", Model: "m", BlockSize: 4, Parent: "00112233445566778899aabbccddeeff", Tokens: []uint32{5, 6, 7, 8, 9, 10, 11, 12}},
		{Name: "shorter than a block", Model: "m", BlockSize: 16, Tokens: seq(15, 1), Digests: []string{}},
		{Name: "lmcache chunk 256", Model: "sim-llama", BlockSize: 256, Tokens: seq(512, 3)},
		{Name: "block size 17: two BLAKE3 blocks", Model: "m", BlockSize: 17, Tokens: seq(34, 5)},
		{Name: "block size 300: two BLAKE3 chunks", Model: "m", BlockSize: 300, Tokens: seq(600, 11)},
	}
}

// reference computes digests straight from the documented layout, with a fresh
// BLAKE3 hasher per block, independent of Hasher's compression-level paths.
func reference(t *testing.T, v vector) (key [32]byte, out []string) {
	var material []byte
	for _, s := range []string{v.Model, v.LoRA, v.CacheSalt} {
		material = binary.LittleEndian.AppendUint32(material, uint32(len(s)))
		material = append(material, s...)
	}
	blake3.DeriveKey(key[:], "oasis 2026-11-21 blockdigest v2", material)
	parent := make([]byte, 16)
	if v.Parent != "" {
		p, err := Parse(v.Parent)
		must.NoError(t, err)
		parent = p[:]
	}
	out = []string{}
	for toks := v.Tokens; len(toks) >= v.BlockSize; toks = toks[v.BlockSize:] {
		h := blake3.New(16, append(append([]byte{}, parent...), key[:16]...))
		for _, tok := range toks[:v.BlockSize] {
			h.Write(binary.LittleEndian.AppendUint32(nil, tok))
		}
		parent = h.Sum(nil)
		out = append(out, Digest(parent).String())
	}
	return key, out
}

func TestVectors(t *testing.T) {
	path := filepath.Join("testdata", "vectors.json")
	if *update {
		vs := vectorInputs()
		for i := range vs {
			key, ds := reference(t, vs[i])
			vs[i].Key = Digest(key[:16]).String() + Digest(key[16:]).String()
			vs[i].Digests = ds
		}
		b, err := json.MarshalIndent(vs, "", "  ")
		must.NoError(t, err)
		must.NoError(t, os.WriteFile(path, append(b, '\n'), 0o644))
	}
	b, err := os.ReadFile(path)
	must.NoError(t, err)
	var vs []vector
	must.NoError(t, json.Unmarshal(b, &vs))
	must.SliceLen(t, len(vectorInputs()), vs)

	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) {
			key, ref := reference(t, v)
			must.Eq(t, v.Key, Digest(key[:16]).String()+Digest(key[16:]).String())
			must.Eq(t, v.Digests, ref, must.Sprint("reference implementation disagrees with the checked-in vector"))

			h, err := New(Domain{Model: v.Model, LoRA: v.LoRA, CacheSalt: v.CacheSalt}, v.BlockSize)
			must.NoError(t, err)
			parent := Root
			if v.Parent != "" {
				parent, err = Parse(v.Parent)
				must.NoError(t, err)
			}
			got := []string{}
			for _, d := range h.AppendDigests(nil, parent, v.Tokens) {
				got = append(got, d.String())
			}
			must.Eq(t, v.Digests, got)
		})
	}
}

// Every block size takes one of three paths (one BLAKE3 block, one chunk,
// several chunks); each must agree with the plain BLAKE3 hasher.
func TestPathsAgreeWithReference(t *testing.T) {
	for _, bs := range []int{1, 3, 15, 16, 17, 32, 255, 256, 257, 512} {
		v := vector{Model: "m", LoRA: "l", BlockSize: bs, Tokens: seq(3*bs+1, uint32(bs)), Parent: "ffeeddccbbaa99887766554433221100"}
		_, want := reference(t, v)
		h, err := New(Domain{Model: v.Model, LoRA: v.LoRA}, bs)
		must.NoError(t, err)
		parent, err := Parse(v.Parent)
		must.NoError(t, err)
		got := []string{}
		for _, d := range h.AppendDigests(nil, parent, v.Tokens) {
			got = append(got, d.String())
		}
		must.Eq(t, want, got, must.Sprintf("block size %d", bs))
	}
}

func TestExtendMatchesAppend(t *testing.T) {
	h, err := New(Domain{Model: "m"}, 4)
	must.NoError(t, err)
	toks := seq(20, 9)
	all := h.Digests(toks)
	must.SliceLen(t, 5, all)
	parent := Root
	for i := 0; i < 5; i++ {
		d, err := h.Extend(parent, toks[4*i:4*i+4])
		must.NoError(t, err)
		must.Eq(t, all[i], d)
		parent = d
	}
	// Resuming from a parent gives the same tail: the router recomputes
	// digests from an event's parent and token ids this way.
	must.Eq(t, all[2:], h.AppendDigests(nil, all[1], toks[8:]))
}

func TestPositionAndDomainSeparation(t *testing.T) {
	block := []uint32{1, 2, 3, 4}
	h, err := New(Domain{Model: "m"}, 4)
	must.NoError(t, err)
	first := h.Digests(block)[0]
	second := h.Digests(append(append([]uint32{}, block...), block...))[1]
	must.NotEq(t, first, second, must.Sprint("same block at another position must not match"))

	for _, d := range []Domain{
		{Model: "m2"},
		{Model: "m", LoRA: "x"},
		{Model: "m", CacheSalt: "x"},
		{Model: "m", LoRA: "x", CacheSalt: ""},
	} {
		o, err := New(d, 4)
		must.NoError(t, err)
		must.NotEq(t, first, o.Digests(block)[0], must.Sprintf("domain %+v", d))
	}
	// Length prefixes keep field boundaries apart.
	must.NotEq(t, Domain{Model: "ab", LoRA: "c"}.Key(), Domain{Model: "a", LoRA: "bc"}.Key())
	must.NotEq(t, Domain{Model: "m", LoRA: "x"}.Key(), Domain{Model: "m", CacheSalt: "x"}.Key())

	c := h.Clone()
	must.Eq(t, first, c.Digests(block)[0])
}

func TestErrors(t *testing.T) {
	_, err := New(Domain{}, 16)
	must.ErrorContains(t, err, "model name is required")
	_, err = New(Domain{Model: "m"}, 0)
	must.ErrorContains(t, err, "must be positive")
	h, err := New(Domain{Model: "m"}, 4)
	must.NoError(t, err)
	_, err = h.Extend(Root, []uint32{1, 2, 3})
	must.ErrorContains(t, err, "block has 3 tokens")
	_, err = Parse("abc")
	must.Error(t, err)
	_, err = Parse("zz112233445566778899aabbccddeeff")
	must.Error(t, err)
}

func TestParseAndUint64s(t *testing.T) {
	h, err := New(Domain{Model: "m"}, 2)
	must.NoError(t, err)
	d := h.Digests([]uint32{1, 2})[0]
	p, err := Parse(d.String())
	must.NoError(t, err)
	must.Eq(t, d, p)
	must.Eq(t, d, FromUint64s(d.Hi(), d.Lo()))
	must.True(t, Root.IsRoot())
	must.False(t, d.IsRoot())
}

func TestAppendDigestsDoesNotAllocate(t *testing.T) {
	h, err := New(Domain{Model: "m"}, 16)
	must.NoError(t, err)
	toks := seq(16*64, 1)
	dst := make([]Digest, 0, 64)
	allocs := testing.AllocsPerRun(20, func() {
		dst = h.AppendDigests(dst[:0], Root, toks)
	})
	must.Eq(t, 0.0, allocs)
}

func BenchmarkAppendDigests(b *testing.B) {
	h, err := New(Domain{Model: "m"}, 16)
	if err != nil {
		b.Fatal(err)
	}
	toks := seq(16*256, 1)
	dst := make([]Digest, 0, 256)
	b.SetBytes(int64(4 * len(toks)))
	b.ReportAllocs()
	for b.Loop() {
		dst = h.AppendDigests(dst[:0], Root, toks)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*256), "ns/block")
}

// Parse decodes the hex form of a digest.
func Parse(s string) (Digest, error) {
	var d Digest
	if hex.DecodedLen(len(s)) != Size {
		return d, fmt.Errorf("parsing digest %q: want %d hex characters", s, 2*Size)
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, fmt.Errorf("parsing digest %q: %w", s, err)
	}
	return d, nil
}
