// Package gobuild builds Oasis commands for tests that run them as real processes.
package gobuild

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// Commands builds the named command packages of this module (import paths, e.g.
// "github.com/oasis-llm/oasis/cmd/oasis-sim") into dir, one binary each, named after the
// package's last element. The error carries the compiler's output.
func Commands(ctx context.Context, dir string, pkgs ...string) error {
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("building %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}
