package discovery

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestPoolServedNamesAndAdapters: an engine is routable by every name it
// serves (its model, further served names, LoRA adapters); invalid lists
// refuse the instance, naming the meta key.
func TestPoolServedNamesAndAdapters(t *testing.T) {
	p := New(Config{})
	p.Set([]Instance{
		{ID: "a", Address: "10.0.0.1:8000", Meta: map[string]string{MetaModel: "m3",
			MetaServedNames: "m3-alias", MetaLoRAAdapters: "sql-lora, chat-lora"}},
		{ID: "b", Address: "10.0.0.2:8000", Meta: map[string]string{MetaModel: "m3", MetaLoRAAdapters: "sql-lora"}},
	})
	must.Eq(t, []string{"chat-lora", "m3", "m3-alias", "sql-lora"}, p.Models())
	must.Eq(t, 2, len(p.All()))
	must.Eq(t, 2, len(p.Workers("m3")))
	must.Eq(t, 2, len(p.Workers("sql-lora")))
	chat := p.Workers("chat-lora")
	must.Eq(t, 1, len(chat))
	must.Eq(t, "a", chat[0].ID)
	must.Eq(t, "m3", chat[0].Model)
	must.Eq(t, "chat-lora", chat[0].Adapter("chat-lora"))
	must.Eq(t, "", chat[0].Adapter("m3-alias"))
	must.Eq(t, []string{"m3-alias"}, p.Workers("m3-alias")[0].Names)
	must.True(t, p.Known("chat-lora"))

	p.Set([]Instance{{ID: "c", Address: "10.0.0.3:8000", Meta: map[string]string{MetaModel: "m3",
		MetaLoRALoadable: "l1=/adapters/l1, l2=org/l2"}}})
	c := p.Workers("l2")
	must.Eq(t, 1, len(c))
	path, ok := c[0].LoadablePath("l2")
	must.True(t, ok)
	must.Eq(t, "org/l2", path)
	must.Eq(t, "l1", c[0].Adapter("l1"))

	for _, tc := range []struct {
		name, key, value string
	}{
		{"empty name", MetaLoRAAdapters, "a,,b"},
		{"own model", MetaServedNames, "m3"},
		{"twice across lists", MetaLoRAAdapters, "m3-alias"},
		{"white space inside", MetaLoRAAdapters, "a b"},
		{"too long", MetaServedNames, strings.Repeat("x", maxNameBytes+1)},
		{"too many", MetaLoRAAdapters, strings.Repeat("x,", maxServedNames) + "y"},
		{"loadable without path", MetaLoRALoadable, "l1"},
		{"loadable empty path", MetaLoRALoadable, "l1="},
		{"loadable name taken", MetaLoRALoadable, "m3-alias=/a"},
		{"loadable path with space", MetaLoRALoadable, "l1=/a b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta := map[string]string{MetaModel: "m3", MetaServedNames: "m3-alias"}
			meta[tc.key] = tc.value
			_, _, _, err := namesOf("m3", func(k string) string { return meta[k] })
			var me *MetaError
			must.ErrorAs(t, err, &me)
			must.Eq(t, tc.key, me.Key)
			p := New(Config{})
			p.Set([]Instance{{ID: "a", Address: "10.0.0.1:8000", Meta: meta}})
			must.Eq(t, 0, len(p.All()))
		})
	}
}
