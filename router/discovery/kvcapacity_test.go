package discovery

import (
	"errors"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/prefixindex"
)

func TestKVCapacityMeta(t *testing.T) {
	cases := []struct {
		name    string
		meta    map[string]string
		want    prefixindex.Capacity
		refused bool
	}{
		{"none", nil, prefixindex.Capacity{}, false},
		{"gpu only, default block size", map[string]string{MetaKVCapacity: "gpu=1600"}, prefixindex.Capacity{GPU: 100}, false},
		{"three tiers, engine block size", map[string]string{MetaKVCapacity: "gpu=1024, cpu=4096,disk=65536", MetaBlockSize: "32"},
			prefixindex.Capacity{GPU: 32, CPU: 128, Disk: 2048}, false},
		{"partial block rounds down", map[string]string{MetaKVCapacity: "gpu=40,disk=0"}, prefixindex.Capacity{GPU: 2}, false},
		{"huge tier clamped", map[string]string{MetaKVCapacity: "gpu=16,disk=68719476736"}, prefixindex.Capacity{GPU: 1, Disk: prefixindex.MaxTierBlocks}, false},
		{"no gpu tier", map[string]string{MetaKVCapacity: "cpu=4096"}, prefixindex.Capacity{}, true},
		{"gpu under one block", map[string]string{MetaKVCapacity: "gpu=15"}, prefixindex.Capacity{}, true},
		{"unknown tier", map[string]string{MetaKVCapacity: "gpu=16,nvme=4096"}, prefixindex.Capacity{}, true},
		{"duplicate tier", map[string]string{MetaKVCapacity: "gpu=16,gpu=32"}, prefixindex.Capacity{}, true},
		{"not a number", map[string]string{MetaKVCapacity: "gpu=16GiB"}, prefixindex.Capacity{}, true},
		{"negative", map[string]string{MetaKVCapacity: "gpu=16,cpu=-1"}, prefixindex.Capacity{}, true},
		{"over the bound", map[string]string{MetaKVCapacity: "gpu=68719476737"}, prefixindex.Capacity{}, true},
		{"no pairs", map[string]string{MetaKVCapacity: "524288"}, prefixindex.Capacity{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, m := poolOfOne(tc.meta)
			if tc.refused {
				must.SliceEmpty(t, p.Workers("m"))
				must.Eq(t, 1.0, promtest.ToFloat64(m.MetaRejected.WithLabelValues(MetaKVCapacity)))
				return
			}
			ws := p.Workers("m")
			must.SliceLen(t, 1, ws)
			must.Eq(t, tc.want, ws[0].KVCapacity)
		})
	}
}

// Whatever a registration writes, kvCapacityOf answers a MetaError or a
// capacity the index accepts.
func FuzzKVCapacityMeta(f *testing.F) {
	for _, s := range []string{"gpu=16", "gpu=1024,cpu=4096,disk=65536", "gpu=1,cpu=x", "gpu==1", ",", "gpu=68719476736", "cpu=1,gpu=99999999999999999999"} {
		f.Add(s, "16")
	}
	f.Fuzz(func(t *testing.T, v, blockSize string) {
		meta := map[string]string{MetaKVCapacity: v, MetaBlockSize: blockSize}
		w := workerOf("i", "10.0.0.1:1", nil, func(k string) string { return meta[k] })
		c, err := kvCapacityOf(w, func(k string) string { return meta[k] })
		if err != nil {
			var me *MetaError
			must.True(t, errors.As(err, &me))
			must.Eq(t, MetaKVCapacity, me.Key)
			return
		}
		if v == "" {
			must.Eq(t, prefixindex.Capacity{}, c)
			return
		}
		must.NoError(t, c.Validate())
	})
}
