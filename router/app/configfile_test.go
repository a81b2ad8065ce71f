package app

import (
	"testing"

	"github.com/shoenig/test/must"
)

// EjectAfter 0 means never in Config as on the command line (-eject-after 0)
// and in the config file (limits.eject_after = 0).
func TestEjectAfterZeroIsNever(t *testing.T) {
	for _, tc := range []struct{ in, want int }{{0, -1}, {-2, -1}, {1, 1}, {3, 3}} {
		must.Eq(t, tc.want, Config{EjectAfter: tc.in}.withDefaults().EjectAfter, must.Sprintf("EjectAfter %d", tc.in))
	}
}
