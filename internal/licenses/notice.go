package licenses

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteNotice writes the third-party licence listing of the modules for
// which keep is true: a table of module, version and licences, then each
// module's licence texts.
func WriteNotice(w io.Writer, mods []Module, keep func(Module) bool) error {
	var sel []Module
	for _, m := range mods {
		if keep(m) {
			sel = append(sel, m)
		}
	}
	slices.SortFunc(sel, func(a, b Module) int { return strings.Compare(a.Path, b.Path) })
	var b strings.Builder
	fmt.Fprintf(&b, "Third-party software linked into these binaries (%d Go modules)\n\n", len(sel))
	for _, m := range sel {
		fmt.Fprintf(&b, "%-60s %-40s %s\n", m.Path, m.Version, joinKinds(m.Kinds))
	}
	for _, m := range sel {
		for _, name := range fileNames(m.Files) {
			fmt.Fprintf(&b, "\n================================================================\n%s %s: %s\n\n", m.Path, m.Version, name)
			b.WriteString(strings.TrimSpace(m.Files[name]))
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
