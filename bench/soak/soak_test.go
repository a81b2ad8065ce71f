package main

import (
	"strings"
	"testing"
	"time"
)

func samples(n int, f func(i int) int64) []sample {
	out := make([]sample, n)
	for i := range out {
		v := f(i)
		out[i] = sample{At: time.Duration(i) * time.Second, RouterRSS: v << 20, RouterGoroutines: v, KVRSS: v << 20, KVGoroutines: v}
	}
	return out
}

func TestVerdict(t *testing.T) {
	cases := []struct {
		name     string
		samples  []sample
		outcomes map[string]int64
		want     []string // substrings, one per fault
	}{
		{"flat", samples(40, func(int) int64 { return 100 }), map[string]int64{"stream/ok": 10}, nil},
		{"noisy but bounded", samples(40, func(i int) int64 { return 100 + int64(i%5)*20 }), nil, nil},
		{"warm-up growth only", samples(40, func(i int) int64 { return min(int64(i)*50, 300) }), nil, nil},
		{"leak", samples(40, func(i int) int64 { return 100 + int64(i)*40 }), nil,
			[]string{"kvcached RSS grows", "kvcached goroutines grows", "router RSS grows", "router goroutines grows"}},
		{"small absolute drift", samples(40, func(i int) int64 { return 10 + int64(i) }), nil, nil},
		{"too short", samples(6, func(int) int64 { return 1 }), nil, []string{"too few", "too few", "too few", "too few"}},
		{"lost request", samples(40, func(int) int64 { return 100 }), map[string]int64{"stream/lost": 1, "stream/ok": 9}, []string{"stream/lost"}},
		{"corrupt block", samples(40, func(int) int64 { return 100 }), map[string]int64{"kvcached/corrupt": 2}, []string{"kvcached/corrupt"}},
		{"bad input answered wrong", samples(40, func(int) int64 { return 100 }), map[string]int64{"bad_input/unexpected:200": 1}, []string{"unexpected:200"}},
		{"errors the client saw are no fault", samples(40, func(int) int64 { return 100 }),
			map[string]int64{"stream/error_event:upstream_error": 3, "whole/error:upstream_unavailable": 1, "stream/transport_error": 1}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := (&report{Samples: tc.samples, Outcomes: tc.outcomes}).verdict()
			if len(got) != len(tc.want) {
				t.Fatalf("faults %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("fault %d = %q, want it to mention %q", i, got[i], w)
				}
			}
		})
	}
}
