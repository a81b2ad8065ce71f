package driver

import (
	"fmt"
	"os"
	"os/user"
	"strconv"

	"github.com/oasis-llm/oasis/nomad-driver/render"
)

// writePlanFiles writes the files a plan renders into the task directory.
// Plain files are 0644 (every account reads them); secret files (a tier's
// password) are 0600 and owned by account, the engine's user. Where the
// account is not known (an unprivileged plugin runs engines as itself: ""),
// the plugin's own user keeps them. A container running as its image's
// user (no task user) cannot be given a file it alone reads: the secret file
// is then 0644 inside the task's secrets directory, which only the
// allocation's tasks mount.
func writePlanFiles(files []render.File, account string, container bool) error {
	for _, f := range files {
		mode := os.FileMode(0o644)
		if f.Secret && !(container && account == "") {
			mode = 0o600
		}
		if err := os.WriteFile(f.Path, f.Content, mode); err != nil {
			return fmt.Errorf("writing %s: %w", f.Path, err)
		}
		// WriteFile keeps the mode of a file that already exists (a restart).
		if err := os.Chmod(f.Path, mode); err != nil {
			return fmt.Errorf("writing %s: %w", f.Path, err)
		}
		if !f.Secret || account == "" {
			continue
		}
		u, err := user.Lookup(account)
		if err != nil {
			return fmt.Errorf("writing %s: looking up the engine's account %q: %w", f.Path, account, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if os.Geteuid() == 0 {
			if err := os.Chown(f.Path, uid, gid); err != nil {
				return fmt.Errorf("writing %s: %w", f.Path, err)
			}
		}
	}
	return nil
}
