package engine

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/kvevents"
)

// TestLoRADomains: the same prompt under an adapter, under another adapter
// and under the base model share no cached block; under the same adapter it
// hits; the adapter's BlockStored events name it.
func TestLoRADomains(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 16, NumGPUBlocks: 64, KVEvents: true})
	prompt := seqTokens(1, 65)
	for _, tc := range []struct {
		id, lora string
		cached   int
	}{
		{"base", "", 0},
		{"sql", "sql", 0},
		{"chat", "chat", 0},
		{"sql-again", "sql", 64},
		{"base-again", "", 64},
	} {
		must.NoError(t, e.Submit(&Request{ID: tc.id, Prompt: prompt, Output: out(1), LoRA: tc.lora}))
		outs, events, _ := runAll(t, e)
		must.Eq(t, tc.cached, outs[tc.id][0].CachedTokens, must.Sprint(tc.id))
		n := 0
		for _, ev := range events {
			if st, ok := ev.(kvevents.BlockStored); ok {
				must.Eq(t, tc.lora, st.LoraName, must.Sprint(tc.id))
				n++
			}
		}
		if tc.cached == 0 {
			must.Positive(t, n, must.Sprint(tc.id, ": no BlockStored event"))
		}
	}
	assertNoLeak(t, e)
}
