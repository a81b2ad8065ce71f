package testutil

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/oasis-llm/oasis/internal/gobuild"
	"github.com/shoenig/test/must"
)

// RunWithCommand is TestMain for a package whose tests run one of this
// module's commands as a real process: it builds the command (an import
// path, e.g. "github.com/oasis-llm/oasis/cmd/oasis-sim") into a temporary
// directory, sets *bin to the binary's path, runs the tests and removes the
// directory. It returns the exit code for os.Exit, 1 if the build fails.
func RunWithCommand(m *testing.M, pkg string, bin *string) int {
	dir, err := os.MkdirTemp("", path.Base(pkg)+"-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := gobuild.Commands(context.Background(), dir, pkg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*bin = filepath.Join(dir, path.Base(pkg))
	return m.Run()
}

// BuildCommand builds one of this module's commands (an import path) into
// the test's temporary directory and returns the binary's path: for a
// package where only some tests, skipped with -short, run the command.
func BuildCommand(t testing.TB, pkg string) string {
	t.Helper()
	dir := t.TempDir()
	must.NoError(t, gobuild.Commands(context.Background(), dir, pkg))
	return filepath.Join(dir, path.Base(pkg))
}
