package peers

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

func TestDecode(t *testing.T) {
	long := strings.Repeat("x", maxNameBytes+1)
	cases := []struct {
		name, msg, field string
	}{
		{"valid", `{"n":"r1","s":1,"l":{"m":{"m":{"i":2,"q":1}},"k":{"team":3.5}}}`, ""},
		{"not JSON", `{"n":`, "unexpected EOF"},
		{"unknown field", `{"n":"r1","x":1}`, "unknown field"},
		{"trailing data", `{"n":"r1"} {}`, "data after"},
		{"no name", `{"s":1}`, "n:"},
		{"long name", `{"n":"` + long + `"}`, "n:"},
		{"negative in flight", `{"n":"r1","l":{"m":{"m":{"i":-1}}}}`, "l.m["},
		{"empty model", `{"n":"r1","l":{"m":{"":{"i":1}}}}`, "l.m["},
		{"negative engine count", `{"n":"r1","l":{"e":{"w":{"p":-1}}}}`, "l.e["},
		{"negative rate", `{"n":"r1","l":{"k":{"team":-1}}}`, "l.k["},
		{"negative band", `{"n":"r1","l":{"m":{"m":{"q":1,"b":-1}}}}`, "l.m[\"m\"].b"},
		{"band past the bound", `{"n":"r1","l":{"m":{"m":{"q":1,"b":100000}}}}`, "l.m[\"m\"].b"},
		{"prefix without keys", `{"n":"r1","p":[{"e":"w"}]}`, "p[0]"},
		{"prefix without engine", `{"n":"r1","p":[{"k":[1]}]}`, "p[0]"},
		{"too large", `{"n":"` + strings.Repeat("x", maxMessageBytes) + `"}`, "bytes, over"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := decode([]byte(tc.msg))
			if tc.field == "" {
				must.NoError(t, err)
				must.Eq(t, ModelLoad{InFlight: 2, Queued: 1}, m.Load.Models["m"])
				must.Eq(t, 3.5, m.Load.Keys["team"])
				return
			}
			must.True(t, errors.Is(err, ErrMessage))
			must.StrContains(t, err.Error(), tc.field)
		})
	}
}

func TestDecodeBoundsEntries(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"n":"r1","l":{"k":{`)
	for i := 0; i <= maxEntries; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strconv.Itoa(i) + `":1`)
	}
	b.WriteString(`}}}`)
	_, err := decode([]byte(b.String()))
	must.ErrorIs(t, err, ErrMessage)
	must.StrContains(t, err.Error(), "entries")
}

func TestDecodeBoundsPrefixKeys(t *testing.T) {
	keys := strings.Repeat("1,", MaxPrefixKeys) + "1"
	_, err := decode([]byte(`{"n":"r1","p":[{"e":"w","k":[` + keys + `]}]}`))
	must.ErrorIs(t, err, ErrMessage)
	must.StrContains(t, err.Error(), "keys")
	m, err := decode([]byte(`{"n":"r1","p":[{"e":"w","k":[1,2,3]}]}`))
	must.NoError(t, err)
	must.Eq(t, []Prefix{{Engine: "w", Keys: []uint64{1, 2, 3}}}, m.Prefixes)
}

// A router's band travels as sent.
func TestDecodeBand(t *testing.T) {
	m, err := decode([]byte(`{"n":"r1","l":{"m":{"m":{"i":1,"q":2,"b":5}}}}`))
	must.NoError(t, err)
	must.Eq(t, ModelLoad{InFlight: 1, Queued: 2, Band: 5}, m.Load.Models["m"])
}
