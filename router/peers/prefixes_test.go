package peers

import (
	"testing"
)

func TestOutbox(t *testing.T) {
	chain := func(n int) []uint64 {
		k := make([]uint64, n)
		for i := range k {
			k[i] = uint64(i + 1)
		}
		return k
	}
	tests := []struct {
		name        string
		adds        [][]uint64
		engine      string
		wantRecs    int
		wantKeys    []int // per record
		wantDropped int
	}{
		{name: "empty", wantRecs: 0},
		{name: "two records", adds: [][]uint64{chain(3), chain(5)}, engine: "e1", wantRecs: 2, wantKeys: []int{3, 5}},
		{name: "no keys ignored", adds: [][]uint64{nil, chain(2)}, engine: "e1", wantRecs: 1, wantKeys: []int{2}},
		{name: "no engine ignored", adds: [][]uint64{chain(2)}, engine: "", wantRecs: 0},
		{name: "long chain cut", adds: [][]uint64{chain(MaxPrefixKeys + 10)}, engine: "e1", wantRecs: 1, wantKeys: []int{MaxPrefixKeys}},
		{name: "oldest dropped past the bound", adds: [][]uint64{chain(MaxPrefixKeys / 2), chain(MaxPrefixKeys / 2), chain(10)}, engine: "e1",
			wantRecs: 2, wantKeys: []int{MaxPrefixKeys / 2, 10}, wantDropped: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var o Outbox
			for _, k := range tc.adds {
				o.Add(tc.engine, k)
			}
			recs, dropped := o.Take()
			if len(recs) != tc.wantRecs || dropped != tc.wantDropped {
				t.Fatalf("got %d records, %d dropped; want %d, %d", len(recs), dropped, tc.wantRecs, tc.wantDropped)
			}
			for i, r := range recs {
				if len(r.Keys) != tc.wantKeys[i] || r.Engine != tc.engine || r.Keys[0] != 1 {
					t.Errorf("record %d: engine %q, %d keys from %d; want %q, %d from 1", i, r.Engine, len(r.Keys), r.Keys[0], tc.engine, tc.wantKeys[i])
				}
			}
			if again, d := o.Take(); len(again) != 0 || d != 0 {
				t.Errorf("Take did not empty the outbox: %d records, %d dropped", len(again), d)
			}
		})
	}
}
