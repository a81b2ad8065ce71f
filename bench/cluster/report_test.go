package cluster

import (
	"bytes"
	"image/png"
	"math"
	"strings"
	"testing"
)

func TestReadTraceValidates(t *testing.T) {
	good := `{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}
{"timestamp": 1, "input_length": 512, "output_length": 1, "hash_ids": [0]}
`
	reqs, err := ReadTrace(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[0].Arrival != 1 {
		t.Fatalf("not sorted by arrival: %+v", reqs)
	}
	for _, bad := range []struct{ line, want string }{
		{`{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [0]}`, "input_length"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [0]}`, "output_length"},
		{`{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}`, "hash ids cover"},
		{`{"timestamp": "x"}`, "line 1"},
	} {
		_, err := ReadTrace(strings.NewReader(bad.line))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: error %v, want %q", bad.line, err, bad.want)
		}
	}
}

func TestOracleHitRatio(t *testing.T) {
	reqs := []*Request{
		{Input: 1024, Output: 1, HashIDs: []int64{1, 2}},    // nothing cached yet
		{Input: 1536, Output: 1, HashIDs: []int64{1, 2, 3}}, // 1024 cached
		{Input: 600, Output: 1, HashIDs: []int64{1, 9}},     // 512 cached (9 is new)
		{Input: 1024, Output: 1, HashIDs: []int64{1, 2}},    // all but the last block: 1008
	}
	got := OracleHitRatio(reqs, 16)
	want := float64(0+1024+512+1008) / float64(1024+1536+600+1024)
	if math.Abs(got-want) > 1e-12 {
		t.Fatalf("oracle %v, want %v", got, want)
	}
}

func TestSummaryAndPlot(t *testing.T) {
	runs := []Result{
		{Policy: PolicyRoundRobin, RateScale: 1, Rate: 1, TTFTP90: 1.5, Throughput: 1, HitRatio: 0.1, JoulesPerToken: 2},
		{Policy: PolicyRoundRobin, RateScale: 2, Rate: 2, TTFTP90: 3, Throughput: 2},
		{Policy: PolicyOasis, RateScale: 1, Rate: 1, TTFTP90: 0.5, Throughput: 1, HitRatio: 0.3, JoulesPerToken: 1},
		{Policy: PolicyOasis, RateScale: 2, Rate: 2, TTFTP90: 1, Throughput: 2},
	}
	if ref := ReferenceScale(runs); ref != 1 {
		t.Fatalf("reference scale %v", ref)
	}
	sums := Summarise(runs, 0.3)
	tg := Targets(sums, runs)
	if len(tg) != 5 || !tg[0].Met || !tg[1].Met || !tg[2].Met || !tg[3].Met {
		t.Fatalf("targets %+v", tg)
	}
	var buf bytes.Buffer
	if err := PlotTTFT(&buf, "TTFT p90 vs rate", runs); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 960 || b.Dy() != 600 {
		t.Fatalf("plot is %v", b)
	}
}
