package pd

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/scoring"
)

// TestSGLangBootstrapRoomIsFresh: each request, and each attempt, gets its
// own room.
func TestSGLangBootstrapRoomIsFresh(t *testing.T) {
	rooms := map[string]bool{}
	for range 50 {
		b, err := SGLangBody([]byte(`{"model":"m"}`), &scoring.Worker{Address: "[::1]:9000", BootstrapPort: 1})
		must.NoError(t, err)
		var m map[string]json.RawMessage
		must.NoError(t, json.Unmarshal(b, &m))
		must.Eq(t, `"::1"`, string(m["bootstrap_host"]))
		must.False(t, strings.HasPrefix(string(m["bootstrap_room"]), "-"))
		rooms[string(m["bootstrap_room"])] = true
	}
	must.MapLen(t, 50, rooms)
}
