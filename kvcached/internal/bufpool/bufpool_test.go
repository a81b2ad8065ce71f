package bufpool

import (
	"testing"
	"unsafe"

	"github.com/shoenig/test/must"
)

func same(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }

func TestGetReusesTheLastBufferOfItsSize(t *testing.T) {
	p := New(4 * MinSize)
	a, b := p.Get(MinSize), p.Get(MinSize)
	must.False(t, same(a, b))
	p.Put(a)
	p.Put(b)
	must.Eq(t, int64(2*MinSize), p.Held())
	must.True(t, same(b, p.Get(MinSize)), must.Sprint("most recently given back first"))
	must.True(t, same(a, p.Get(MinSize)))
	must.Eq(t, int64(0), p.Held())
	must.False(t, same(a, p.Get(MinSize)), must.Sprint("empty pool allocates"))
	// Another size is never handed out for n.
	p.Put(p.Get(2 * MinSize))
	must.Eq(t, MinSize, len(p.Get(MinSize)))
}

func TestPutKeepsWithinTheLimit(t *testing.T) {
	const m = MinSize
	tests := []struct {
		name string
		put  []int       // sizes given back, in order
		kept map[int]int // buffers held afterwards, by size
	}{
		{"below MinSize is dropped", []int{m - 1}, map[int]int{}},
		{"over the limit is dropped", []int{5 * m}, map[int]int{}},
		{"full of its own size: dropped", []int{2 * m, 2 * m, 2 * m}, map[int]int{2 * m: 2}},
		{"another size makes room", []int{2 * m, 2 * m, 3 * m}, map[int]int{2 * m: 0, 3 * m: 1}},
		{"fits beside others", []int{m, m, 2 * m}, map[int]int{m: 2, 2 * m: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := New(4 * m)
			for _, n := range tc.put {
				p.Put(make([]byte, n))
			}
			var held int64
			for n, c := range tc.kept {
				must.Eq(t, c, len(p.free[n]), must.Sprintf("buffers of %d bytes", n))
				held += int64(n * c)
			}
			must.Eq(t, held, p.Held())
		})
	}
}

func TestPutRefusesASlicedBuffer(t *testing.T) {
	p := New(4 * MinSize)
	b := make([]byte, 2*MinSize)
	p.Put(b[:MinSize]) // its capacity is not its length: Get(n) must return cap n
	must.Eq(t, int64(0), p.Held())
}

func TestNilPoolAllocates(t *testing.T) {
	var p *Pool
	b := p.Get(MinSize)
	must.Eq(t, MinSize, len(b))
	p.Put(b)
	must.Eq(t, int64(0), p.Held())
}
