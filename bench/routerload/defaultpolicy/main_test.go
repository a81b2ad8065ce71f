package main

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// The printed document is one the router's -policy-file accepts, and it reads
// back as policy.Default().
func TestDefaultRoundTrips(t *testing.T) {
	b, err := json.Marshal(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	reg, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.CacheTerms(nil)...)...)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := policy.Parse(b, reg)
	if err != nil {
		t.Fatalf("router rejects %s: %v", b, err)
	}
	if !reflect.DeepEqual(doc, policy.Default()) {
		t.Fatalf("%s reads back as %+v, want %+v", b, doc, policy.Default())
	}
}
