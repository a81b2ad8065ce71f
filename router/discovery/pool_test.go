package discovery

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestPoolSet(t *testing.T) {
	p := New(Config{})
	p.Set([]Instance{
		{ID: "b", Address: "10.0.0.2:8000", Meta: map[string]string{MetaModel: "m", MetaEngine: "vllm", MetaRole: "decode",
			MetaBlockSize: "16", MetaKVEvents: "tcp://10.0.0.2:5557", MetaMetricsPath: "/prometheus/metrics", MetaNode: "n1"}},
		{ID: "a", Address: "10.0.0.1:8000", Meta: map[string]string{MetaModel: "m"}},
		{ID: "c", Address: "10.0.0.3:8000", Tags: []string{"oasis", "oasis_model=other"}},
		{ID: "nomodel", Address: "10.0.0.4:8000"},
		{ID: "a", Address: "10.0.0.9:8000", Meta: map[string]string{MetaModel: "m"}}, // duplicate id
	})
	ws := p.Workers("m")
	must.Eq(t, 2, len(ws))
	must.Eq(t, "a", ws[0].ID) // sorted by id
	must.Eq(t, "both", ws[0].Role)
	must.Eq(t, "/metrics", ws[0].MetricsPath)
	b := ws[1]
	must.Eq(t, "vllm", b.Engine)
	must.Eq(t, "decode", b.Role)
	must.Eq(t, 16, b.BlockSize)
	must.Eq(t, "tcp://10.0.0.2:5557", b.KVEventsEndpoint)
	must.Eq(t, "/prometheus/metrics", b.MetricsPath)
	must.Eq(t, "n1", b.Node)
	must.Eq(t, []string{"m", "other"}, p.Models())
	must.Eq(t, 3, len(p.All()))

	// Live signals survive an update; a worker that leaves and returns starts fresh.
	end := b.Live.Begin(5)
	defer end()
	p.Set([]Instance{{ID: "b", Address: "10.0.0.2:8000", Meta: map[string]string{MetaModel: "m"}}})
	must.Eq(t, int64(1), p.Workers("m")[0].Signals().InFlight)
	must.Nil(t, p.Workers("other"))
	must.True(t, p.Known("other")) // served once: 503, not 404
	must.False(t, p.Known("never"))
	p.Set(nil)
	p.Set([]Instance{{ID: "b", Address: "10.0.0.2:8000", Meta: map[string]string{MetaModel: "m"}}})
	must.Eq(t, int64(0), p.Workers("m")[0].Signals().InFlight)
}

func TestPoolReadsReplayEndpoint(t *testing.T) {
	p := New(Config{})
	p.Set([]Instance{
		{ID: "r", Address: "10.0.0.2:8000", Meta: map[string]string{MetaModel: "m", MetaKVEvents: "tcp://10.0.0.2:5557",
			MetaKVEventsReplay: "tcp://10.0.0.2:5558"}},
		{ID: "s", Address: "10.0.0.3:8000", Meta: map[string]string{MetaModel: "m", MetaKVEvents: "tcp://10.0.0.3:5557"}},
	})
	ws := p.Workers("m")
	must.Eq(t, 2, len(ws))
	must.Eq(t, "tcp://10.0.0.2:5558", ws[0].KVEventsReplay)
	must.Eq(t, "", ws[1].KVEventsReplay)
}

func TestKVCachesOf(t *testing.T) {
	got := KVCachesOf([]Instance{
		{ID: "kc-b", Address: "10.0.0.2:6380", Meta: map[string]string{MetaNode: "node-b", MetaKVEvents: "tcp://10.0.0.2:7000",
			MetaKVEventsReplay: "tcp://10.0.0.2:7001", "oasis_quic_port": "9381"}},
		{ID: "kc-a", Address: "10.0.0.1:6380", Meta: map[string]string{MetaNode: "node-a", MetaKVEvents: "tcp://10.0.0.1:7000"}},
		{ID: "no-events", Address: "10.0.0.3:6380", Meta: map[string]string{MetaNode: "node-c"}},
		{ID: "no-node", Address: "10.0.0.4:6380", Meta: map[string]string{MetaKVEvents: "tcp://10.0.0.4:7000"}},
		{ID: "kc-a", Address: "10.0.0.9:6380", Meta: map[string]string{MetaNode: "node-x", MetaKVEvents: "tcp://10.0.0.9:7000"}},
	})
	must.Eq(t, []KVCache{
		{ID: "kc-a", Address: "10.0.0.1:6380", Node: "node-a", KVEvents: "tcp://10.0.0.1:7000"},
		{ID: "kc-b", Address: "10.0.0.2:6380", Node: "node-b", KVEvents: "tcp://10.0.0.2:7000", KVEventsReplay: "tcp://10.0.0.2:7001"},
	}, got)
}
