package config

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

// TestTaskConfigDecodesAsNomadsClientEncodes goes the way a job's config block reaches StartTask:
// hclspec → cty → cty's msgpack encoding → DecodeDriverConfig. cty sends 0.9 as the string
// "0.9" (float64 cannot hold it exactly), which a float64 field cannot decode.
func TestTaskConfigDecodesAsNomadsClientEncodes(t *testing.T) {
	cases := []struct {
		name         string
		util, sizeGB any
		wantUtil     Float
		wantSize     Float
	}{
		{"inexact decimals", 0.9, 0.5, 0.9, 0.5},
		{"two places", 0.85, 12.25, 0.85, 12.25},
		{"integers", 1, 32, 1, 32},
		{"numeric strings", "0.92", "64", 0.92, 64},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			buf, err := hclspec.Encode(TaskSpec, map[string]any{
				"engine": "vllm", "model": "m", "gpu_memory_utilization": tc.util, "kv_offload_size_gb": tc.sizeGB,
				"tensor_parallel_size": 2,
			})
			must.NoError(t, err)
			var cfg TaskConfig
			must.NoError(t, base.MsgPackDecode(buf, &cfg))
			must.Eq(t, tc.wantUtil, cfg.GPUMemoryUtilization)
			must.Eq(t, tc.wantSize, cfg.KVOffloadSizeGB)
			must.Eq(t, 2, cfg.TensorParallelSize)
		})
	}
}
