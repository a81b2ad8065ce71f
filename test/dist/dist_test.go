// Package dist tests scripts/dist.sh, the release tarballs `make dist` builds.
package dist

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/shoenig/test/must"
)

// runDist builds one small command for the host's architecture only: the whole matrix takes
// minutes, this keeps the check fast while exercising naming, packaging and checksums.
func runDist(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("../../scripts/dist.sh")
	cmd.Env = append(os.Environ(),
		"OASIS_VERSION=v0.0.0-test",
		"DIST_ARCHES="+runtime.GOARCH,
		"DIST_CMDS=oasis-sim",
		"DIST_DIR="+dir,
	)
	out, err := cmd.CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
}

func tarNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	must.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	must.NoError(t, err)
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		must.NoError(t, err)
		must.Eq(t, 0o755, h.Mode&0o777, must.Sprintf("%s is not executable", h.Name))
		names = append(names, h.Name)
	}
}

func TestDistTarballAndChecksums(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	runDist(t, dir)

	name := "oasis_v0.0.0-test_linux_" + runtime.GOARCH + ".tar.gz"
	must.Eq(t, []string{"oasis-sim"}, tarNames(t, filepath.Join(dir, name)))

	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	must.NoError(t, err)
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dir
	out, err := check.CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.Eq(t, name+": OK\n", string(out))

	// A rebuild of the same tree gives the same bytes: published checksums stay valid.
	runDist(t, dir)
	again, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	must.NoError(t, err)
	must.Eq(t, string(sums), string(again))
}

// A corrupted tarball fails the check, which is what the jobs' artifact checksum relies on.
func TestDistChecksumDetectsCorruption(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	runDist(t, dir)
	name := filepath.Join(dir, "oasis_v0.0.0-test_linux_"+runtime.GOARCH+".tar.gz")
	f, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
	must.NoError(t, err)
	_, err = f.Write([]byte{0})
	must.NoError(t, err)
	must.NoError(t, f.Close())
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dir
	must.Error(t, check.Run())
}
