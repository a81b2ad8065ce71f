package main

import (
	"reflect"
	"testing"
)

func TestPairedRatios(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b []float64
		want []float64
	}{
		{"paired by round", []float64{100, 90, 120}, []float64{100, 100, 100}, []float64{1, 0.9, 1.2}},
		{"shorter peer", []float64{100, 90}, []float64{50}, []float64{2}},
		{"idle peer round skipped", []float64{100, 90}, []float64{0, 90}, []float64{1}},
		{"nothing", nil, []float64{1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pairedRatios(tc.a, tc.b); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("pairedRatios = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDescribeRatios(t *testing.T) {
	for _, tc := range []struct {
		rs   []float64
		want string
	}{
		{[]float64{1.02, 0.98, 1.0}, "median 1.000, min 0.980, max 1.020, 2 of 3 rounds ≥ 1"},
		{[]float64{0.9, 1.1, 0.95, 1.05}, "median 1.000, min 0.900, max 1.100, 2 of 4 rounds ≥ 1"},
	} {
		if got := describeRatios(tc.rs); got != tc.want {
			t.Errorf("describeRatios(%v) = %q, want %q", tc.rs, got, tc.want)
		}
	}
}

func TestParseCPUPids(t *testing.T) {
	got, err := parseCPUPids("router=1,router-mesh=2,router-mesh/sidecars=3")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]probe{"router": {{"router", 1}}, "router-mesh": {{"router-mesh", 2}, {"router-mesh/sidecars", 3}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parseCPUPids = %v, want %v", got, want)
	}
	for _, bad := range []string{"router", "router=x", "=1", "router=0"} {
		if _, err := parseCPUPids(bad); err == nil {
			t.Errorf("parseCPUPids(%q): no error", bad)
		}
	}
}

func TestParseMeshTargets(t *testing.T) {
	got, err := parseMeshTargets("router-mesh=oasis-router,direct-sidecar=oasis-engine")
	if err != nil || !reflect.DeepEqual(got, map[string]string{"router-mesh": "oasis-router", "direct-sidecar": "oasis-engine"}) {
		t.Fatalf("parseMeshTargets = %v, %v", got, err)
	}
	if _, err := parseMeshTargets("router-mesh"); err == nil {
		t.Error("no error for an entry without =")
	}
}
