package app

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/discovery"
)

// Through the router app: two idle engines with KV events whose events have
// not arrived yet (endpoints nobody publishes on: every copy stays in
// flight). The first request of a new prefix goes to one of them; the
// router's in-flight record credits that engine at once, so every request
// that follows the prefix goes there too, where without the record each
// would see nobody holding it and the load tie would scatter them.
func TestInflightRecordKeepsFollowersOnTheFirstEngine(t *testing.T) {
	var served [2]atomic.Int64
	engines := make([]*httptest.Server, 2)
	for i := range engines {
		e := &engine{events: 1}
		engines[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				served[i].Add(1)
			}
			e.serve(w, r)
		}))
		t.Cleanup(engines[i].Close)
	}
	cfg := baseConfig(t, engines[0].URL)
	cfg.PolicyFile = policyFile(t, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`)
	r := start(t, cfg)
	testutil.Eventually(t, 10*time.Second, "the static engine in the pool", func() bool {
		return len(r.Pool().Workers("m")) == 1
	})
	events := func() string { return "tcp://" + testutil.FreeAddr(t) }
	var insts []discovery.Instance
	for i, e := range engines {
		insts = append(insts, discovery.Instance{ID: fmt.Sprintf("e%d", i), Address: strings.TrimPrefix(e.URL, "http://"),
			Meta: map[string]string{"oasis_model": "m", "oasis_engine": "sim", discovery.MetaKVEvents: events()}})
	}
	r.Pool().Set(insts)
	testutil.Eventually(t, 10*time.Second, "both engines event-driven in the cache state", func() bool {
		return len(r.Pool().Workers("m")) == 2 && r.cache.EventDriven("e0") && r.cache.EventDriven("e1")
	})

	shared := strings.Repeat("a long shared context that every follower repeats word for word ", 40)
	const n = 8
	for i := range n {
		completePrompt(t, r.url("http"), "m", fmt.Sprintf("%s question %d", shared, i))
	}
	a, b := served[0].Load(), served[1].Load()
	must.Eq(t, int64(n), a+b)
	must.True(t, a == n || b == n, must.Sprintf("followers scattered: %d and %d requests", a, b))
	holder, other := "e0", "e1"
	if b == n {
		holder, other = other, holder
	}
	must.Positive(t, r.cache.InflightIndex().WorkerEntries(holder))
	must.Eq(t, 0, r.cache.InflightIndex().WorkerEntries(other))
}
