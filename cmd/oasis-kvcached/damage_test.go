package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestBinaryStartsAfterIndexDamage damages the Pebble index of a stopped
// kvcached in each way an operator meets (a flipped byte in an SST, an
// empty MANIFEST, a missing SST) and starts it again: it serves, with an
// empty disk tier, the damaged index moved aside and counted. Before, it
// exited at every start ("opening disk index: ..."), and Nomad restarted it
// forever.
func TestBinaryStartsAfterIndexDamage(t *testing.T) {
	for _, kind := range []string{"flipped byte in an SST", "empty MANIFEST", "missing SST"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"--ram-bytes", "64MiB", "--disk-bytes", "256MiB", "--data-dir", dir}
			ctx := context.Background()
			p := start(t, args...)
			for i := 0; i < 100; i++ {
				must.NoError(t, p.client.Set(ctx, blockKey(i), blockValue(i), 0).Err())
				must.NoError(t, p.client.Set(ctx, fmt.Sprintf("meta%d", i), "m", 0).Err())
			}
			must.NoError(t, p.Stop())
			// The next start replays the index's log into an SST.
			p = start(t, args...)
			must.Eq(t, "m", p.client.Get(ctx, "meta1").Val())
			must.NoError(t, p.Stop())

			damaged := false
			ents, err := os.ReadDir(filepath.Join(dir, "index"))
			must.NoError(t, err)
			for _, e := range ents {
				path := filepath.Join(dir, "index", e.Name())
				switch {
				case kind == "flipped byte in an SST" && strings.HasSuffix(e.Name(), ".sst"):
					b, err := os.ReadFile(path)
					must.NoError(t, err)
					b[len(b)/3] ^= 0x01
					must.NoError(t, os.WriteFile(path, b, 0o600))
				case kind == "empty MANIFEST" && strings.HasPrefix(e.Name(), "MANIFEST-"):
					must.NoError(t, os.Truncate(path, 0))
				case kind == "missing SST" && strings.HasSuffix(e.Name(), ".sst"):
					must.NoError(t, os.Remove(path))
				default:
					continue
				}
				damaged = true
			}
			must.True(t, damaged, must.Sprint("no index file to damage"))

			p = start(t, args...)
			must.Eq(t, 1.0, p.metric(t, "oasis_kvcached_index_damaged_total"))
			must.Eq(t, 0.0, p.metric(t, `oasis_kvcached_blocks{tier="disk"}`))
			must.StrContains(t, p.Output(), "[ERROR] oasis-kvcached.store.disk: disk index damaged: moved aside")
			aside, err := filepath.Glob(filepath.Join(dir, "index.damaged-*"))
			must.NoError(t, err)
			must.Len(t, 1, aside)
			must.NoError(t, p.client.Set(ctx, "after", "v", 0).Err())
			must.Eq(t, "v", p.client.Get(ctx, "after").Val())
			val := bytes.Repeat([]byte{3}, 100<<10)
			must.NoError(t, p.client.Set(ctx, "big", val, 0).Err())
			got, err := p.client.Get(ctx, "big").Bytes()
			must.NoError(t, err)
			must.True(t, bytes.Equal(val, got))
		})
	}
}
