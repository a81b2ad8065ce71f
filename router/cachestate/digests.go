package cachestate

import (
	"sync"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// Key is the prefix index key of a block digest: its first 64 bits. Among a
// million live blocks the chance that two keys collide is about 3·10⁻⁸, and a
// collision costs at most one mis-scored routing decision.
func Key(d blockdigest.Digest) uint64 { return d.Hi() }

type domainKey struct {
	domain    blockdigest.Domain
	blockSize int
}

// Digester computes index keys of token sequences. It is safe for concurrent
// use: it keeps a pool of hashers per (model, LoRA, salt, block size), so the
// domain key is derived once and no call allocates a hasher.
type Digester struct {
	mu    sync.Mutex
	pools map[domainKey]*sync.Pool
}

// NewDigester returns an empty Digester.
func NewDigester() *Digester {
	return &Digester{pools: make(map[domainKey]*sync.Pool)}
}

func (g *Digester) pool(d blockdigest.Domain, blockSize int) (*sync.Pool, error) {
	k := domainKey{d, blockSize}
	g.mu.Lock()
	defer g.mu.Unlock()
	if p, ok := g.pools[k]; ok {
		return p, nil
	}
	proto, err := blockdigest.New(d, blockSize)
	if err != nil {
		return nil, err
	}
	p := &sync.Pool{New: func() any { return proto.Clone() }}
	p.Put(proto)
	g.pools[k] = p
	return p, nil
}

// Hasher returns a hasher for the domain; give it back with Release.
func (g *Digester) Hasher(d blockdigest.Domain, blockSize int) (*blockdigest.Hasher, error) {
	p, err := g.pool(d, blockSize)
	if err != nil {
		return nil, err
	}
	return p.Get().(*blockdigest.Hasher), nil
}

// Release returns a hasher obtained from Hasher.
func (g *Digester) Release(d blockdigest.Domain, h *blockdigest.Hasher) {
	g.mu.Lock()
	p := g.pools[domainKey{d, h.BlockSize()}]
	g.mu.Unlock()
	if p != nil {
		p.Put(h)
	}
}

// AppendKeys appends the index keys of every full block of tokens (a
// sequence from its start) to dst.
func (g *Digester) AppendKeys(dst []uint64, d blockdigest.Domain, blockSize int, tokens []uint32) ([]uint64, error) {
	h, err := g.Hasher(d, blockSize)
	if err != nil {
		return dst, err
	}
	defer g.Release(d, h)
	parent := blockdigest.Root
	var one [1]blockdigest.Digest
	for len(tokens) >= blockSize {
		parent = h.AppendDigests(one[:0], parent, tokens[:blockSize])[0]
		dst = append(dst, Key(parent))
		tokens = tokens[blockSize:]
	}
	return dst, nil
}

// TierOfMedium maps a vLLM event medium to an index tier; "" (older engines)
// means GPU.
func TierOfMedium(medium string) (prefixindex.Tier, bool) {
	switch medium {
	case "", "GPU", "gpu", "cuda":
		return prefixindex.TierGPU, true
	case "CPU", "cpu", "CPU_PINNED", "cpu_pinned":
		return prefixindex.TierCPU, true
	case "STORAGE", "DISK", "storage", "disk", "LOCAL_DISK":
		return prefixindex.TierDisk, true
	}
	return 0, false
}
