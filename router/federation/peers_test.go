package federation

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

func TestPeersFromEntries(t *testing.T) {
	entry := func(addr string, port int, meta map[string]string) *consulapi.ServiceEntry {
		return &consulapi.ServiceEntry{Node: &consulapi.Node{Address: "10.0.0.9"},
			Service: &consulapi.AgentService{Address: addr, Port: port, Meta: meta}}
	}
	good := map[string]string{MetaDC: "dc2", MetaModels: "llama-3-8b,qwen/qwen3-32b"}
	bad := map[string]int{}
	got := peersFromEntries("dc2", []*consulapi.ServiceEntry{
		entry("10.0.0.2", 8443, good),
		entry("", 8443, good), // the node's address
		entry("10.0.0.3", 0, good),
		entry("evil host", 8443, good),
		entry("10.0.0.4", 8443, map[string]string{MetaDC: "dc3", MetaModels: "m"}),
		entry("10.0.0.5", 8443, map[string]string{MetaDC: "dc2", MetaModels: "bad model"}),
		entry("10.0.0.6", 8443, map[string]string{MetaDC: "dc2", MetaModels: strings.Repeat("m,", 300) + "m"}),
		entry("10.0.0.7", 8443, map[string]string{MetaDC: "dc2"}),
		{Service: nil},
	}, func(reason string) { bad[reason]++ })
	must.Eq(t, []Peer{
		{DC: "dc2", Addr: "10.0.0.2:8443", Models: []string{"llama-3-8b", "qwen/qwen3-32b"}},
		{DC: "dc2", Addr: "10.0.0.7:8443", Models: []string{}}, // no engine yet: serves none
		{DC: "dc2", Addr: "10.0.0.9:8443", Models: []string{"llama-3-8b", "qwen/qwen3-32b"}},
	}, got)
	must.Eq(t, map[string]int{"address": 2, "dc": 1, "models": 2}, bad)
}

// TestFrozenDatacenterGoesStale: a remote Consul that never answers (frozen,
// or a silent link cut) marks only that datacenter stale, within the
// query's own deadline, while another datacenter's routers are found.
func TestFrozenDatacenterGoesStale(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/catalog/datacenters":
			_, _ = io.WriteString(w, `["dc1","dc2","dc3"]`)
		case r.URL.Query().Get("dc") == "dc2":
			<-r.Context().Done() // frozen
		case r.URL.Query().Get("index") != "":
			// dc3: no change; Consul answers when the wait ends.
			select {
			case <-r.Context().Done():
			case <-time.After(300 * time.Millisecond):
			}
			fallthrough
		default:
			w.Header().Set("X-Consul-Index", "7")
			w.Header().Set("X-Consul-KnownLeader", "true")
			w.Header().Set("X-Consul-LastContact", "0")
			_, _ = io.WriteString(w, `[{"Node":{"Address":"127.0.0.1"},"Service":{"Address":"127.0.0.1","Port":9443,
				"Meta":{"oasis_dc":"dc3","oasis_models":"m"}}}]`)
		}
	}))
	defer srv.Close()
	client, err := consulapi.NewClient(&consulapi.Config{Address: srv.Listener.Addr().String()})
	must.NoError(t, err)
	ca := tlsfilestest.NewCA(t, "federation")
	f := startFed(t, Config{DC: "dc1", Identity: testIdentity(t, ca, "dc1"), Consul: client,
		QueryWait: 300 * time.Millisecond, QueryTimeout: 200 * time.Millisecond,
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: testWriter{t}})})
	start := time.Now()
	testutil.Eventually(t, 3*time.Second, "dc2's peers to go stale after its query fails", func() bool { return f.peers.Stale("dc2") })
	must.Less(t, time.Second, time.Since(start)) // QueryWait + QueryTimeout, and some slack
	must.Eq(t, []Peer{{DC: "dc3", Addr: "127.0.0.1:9443", Models: []string{"m"}}}, f.peers.snapshot()["dc3"])
	must.False(t, f.peers.Stale("dc3"))
}

// testWriter sends logs to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestBeginSkipsRoutersWithoutModels: a router registered with no models
// (no engine yet) is pushed summaries, so it can forward its own requests,
// but is never a forwarding target; a static peer naming no models serves
// any.
func TestBeginSkipsRoutersWithoutModels(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	f, err := New(Config{DC: "dc1", Identity: testIdentity(t, ca, "dc1"), Policy: enabled,
		Local:       func() []ModelSummary { return nil },
		StaticPeers: []Peer{{DC: "dc2", Addr: "10.0.0.1:1", Models: []string{}}, {DC: "dc3", Addr: "10.0.0.2:1"}}})
	must.NoError(t, err)
	defer f.Close()
	must.Len(t, 2, f.allPeers())
	_, err = f.Begin(Decision{DC: "dc2", Reason: ReasonNoLocalWorker}, "m")
	must.ErrorIs(t, err, ErrNoPeer)
	tg, err := f.Begin(Decision{DC: "dc3", Reason: ReasonNoLocalWorker}, "m")
	must.NoError(t, err)
	must.Eq(t, "10.0.0.2:1", tg.Addr)
}

// TestModelsMetaRoundTrip: a model list longer than one meta value (Consul's
// 512 bytes) continues in numbered keys and reads back whole; past the
// bounds the rest is reported as not announced; a peer's meta that breaks
// the bounds is refused.
func TestModelsMetaRoundTrip(t *testing.T) {
	names := func(n, size int) []string {
		out := make([]string, n)
		for i := range out {
			s := fmt.Sprintf("model-%03d-", i)
			out[i] = s + strings.Repeat("x", size-len(s))
		}
		return out
	}
	for _, tc := range []struct {
		name           string
		models         []string
		chunks, unsent int
	}{
		{"none", nil, 0, 0},
		{"one value", names(3, 20), 1, 0},
		{"exactly 512 bytes", names(16, 31), 1, 0}, // 16×31 + 15 commas = 511
		{"two values", names(40, 20), 2, 0},
		{"name cap", names(300, 12), 7, 44},    // 39 names per value
		{"chunk cap", names(200, 100), 8, 160}, // 5 names per value
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta := map[string]string{MetaDC: "dc1"}
			must.Eq(t, tc.unsent, ModelsMeta(meta, tc.models))
			must.MapLen(t, tc.chunks+1, meta)
			for k, v := range meta {
				must.LessEq(t, maxMetaValue, len(v), must.Sprint(k))
			}
			got, ok := parseModelsMeta(meta)
			must.True(t, ok)
			must.Eq(t, append([]string{}, tc.models[:len(tc.models)-tc.unsent]...), got)
		})
	}
	for _, tc := range []struct {
		name string
		meta map[string]string
		want []string
		ok   bool
	}{
		{"gap ends the list", map[string]string{MetaModels: "a", MetaModels + "_2": "c"}, []string{"a"}, true},
		{"empty value", map[string]string{MetaModels: "a", MetaModels + "_1": ""}, nil, false},
		{"value over 512 bytes", map[string]string{MetaModels: strings.Repeat("m", 513)}, nil, false},
		{"bad name in a continuation", map[string]string{MetaModels: "a", MetaModels + "_1": "b c"}, nil, false},
		{"over 256 names", map[string]string{MetaModels: strings.Repeat("m,", 200) + "m", MetaModels + "_1": strings.Repeat("n,", 60) + "n"}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseModelsMeta(tc.meta)
			must.Eq(t, tc.ok, ok)
			must.Eq(t, tc.want, got)
		})
	}
}
