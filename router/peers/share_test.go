package peers

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestAllocate(t *testing.T) {
	cases := []struct {
		name   string
		total  int
		demand []float64
		want   []int
	}{
		{"idle routers split evenly", 6, []float64{0, 0, 0}, []int{2, 2, 2}},
		{"remainder to the earlier names", 4, []float64{0, 0, 0}, []int{2, 1, 1}},
		{"in proportion to 1+demand", 10, []float64{9, 0, 0}, []int{8, 1, 1}},
		{"one slot to every router with work first", 3, []float64{100, 100, 1}, []int{1, 1, 1}},
		{"fewer slots than routers with work", 2, []float64{5, 5, 5}, []int{1, 1, 0}},
		{"no routers", 3, nil, []int{}},
		{"one router takes all", 7, []float64{0}, []int{7}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := make([]claim, len(tc.demand))
			for i, d := range tc.demand {
				cs[i].demand = d
			}
			got := allocate(tc.total, cs)
			must.Eq(t, tc.want, got)
			sum := 0
			for _, n := range got {
				sum += n
			}
			if len(cs) > 0 {
				must.Eq(t, tc.total, sum, must.Sprint("a split agreed on sums to the total"))
			}
		})
	}
}

func TestShareOf(t *testing.T) {
	cases := []struct {
		name string
		cs   []claim
		want int
	}{
		{"own part when the others are within theirs", // 1 first, then 5 × 2/4 rounded up
			[]claim{{demand: 1, known: true, used: 0}, {demand: 0, known: true, used: 1}, {known: true, used: 1}}, 4},
		{"less when another still runs more than its part",
			[]claim{{demand: 9, known: true}, {demand: 1, known: true, used: 5}, {known: true}}, 1},
		{"an unknown router is taken to use its whole part",
			[]claim{{demand: 0, known: true}, {}, {}}, 2},
		{"an unknown router holds at least its even part, whatever this one's demand",
			[]claim{{demand: 50, known: true}, {}, {}}, 2},
		{"never negative",
			[]claim{{known: true}, {known: true, used: 9}, {known: true, used: 9}}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.want, shareOf(6, 0, tc.cs))
		})
	}
	must.Eq(t, 0, shareOf(0, 0, []claim{{}}), must.Sprint("no cap stays no cap"))
}

func TestFractionOf(t *testing.T) {
	must.Eq(t, 1.0/3, fractionOf(0, []claim{{}, {}, {}}))
	must.Eq(t, 0.8, fractionOf(0, []claim{{demand: 7}, {demand: 1}}))
	must.Eq(t, 1.0, fractionOf(0, []claim{{}}))
}

// The split runs under admission's lock on every admission: its cost with
// 16 routers.
func BenchmarkShareOf16(b *testing.B) {
	cs := make([]claim, 16)
	for i := range cs {
		cs[i] = claim{demand: float64(i), known: true, used: i % 3, share: 1}
	}
	b.ReportAllocs()
	for b.Loop() {
		shareOf(64, 3, cs)
	}
}

// Priority across routers: when requests wait at several routers, those
// whose queue's highest band is below the highest waiting anywhere claim no
// demand, so the split gives the cap to the higher band; routers with
// nothing queued, and splits where every queue holds the same band, are as
// before.
func TestByBand(t *testing.T) {
	cases := []struct {
		name   string
		cs     []claim
		demand []float64
		shares []int // shareOf(8, i, byBand(cs)) for each i
	}{
		{"a lower band waiting claims nothing",
			[]claim{{demand: 12, known: true, waiting: true, band: 1}, {demand: 12, known: true, waiting: true, band: 0}},
			[]float64{12, 0}, []int{8, 0}},
		{"same band: by demand",
			[]claim{{demand: 6, known: true, waiting: true, band: 2}, {demand: 2, known: true, waiting: true, band: 2}},
			[]float64{6, 2}, []int{5, 3}},
		{"nothing queued keeps its demand",
			[]claim{{demand: 6, known: true, waiting: true, band: 3}, {demand: 2, known: true, used: 2}},
			[]float64{6, 2}, []int{5, 3}},
		{"the lower band's slots in flight stay held until freed",
			[]claim{{demand: 10, known: true, waiting: true, band: 1}, {demand: 9, known: true, waiting: true, band: 0, used: 5, share: 5}},
			[]float64{10, 0}, []int{3, 0}},
		{"an unknown router is not demoted",
			[]claim{{demand: 10, known: true, waiting: true, band: 1}, {}},
			[]float64{10, 0}, []int{4, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := byBand(append([]claim(nil), tc.cs...))
			for i, c := range cs {
				must.Eq(t, tc.demand[i], c.demand, must.Sprintf("claim %d's demand", i))
				must.Eq(t, tc.shares[i], shareOf(8, i, cs), must.Sprintf("router %d's share", i))
			}
		})
	}
}
