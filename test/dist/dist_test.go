// Package dist tests scripts/dist.sh, the release tarballs `make dist` builds.
package dist

import (
	"archive/tar"
	"compress/gzip"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// runDist builds one small command for the host's architecture only: the whole matrix takes
// minutes, this keeps the check fast while exercising naming, packaging and checksums.
func runDist(t *testing.T, dir string) {
	t.Helper()
	runDistArch(t, dir, runtime.GOARCH)
}

// runDistArch builds one small command for arch.
func runDistArch(t *testing.T, dir, arch string) {
	t.Helper()
	cmd := exec.Command("../../scripts/dist.sh")
	cmd.Env = append(os.Environ(),
		"OASIS_VERSION=v0.0.0-test",
		"DIST_ARCHES="+arch,
		"DIST_CMDS=oasis-sim",
		"DIST_DIR="+dir,
	)
	out, err := cmd.CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
}

// tarFiles returns the tarball's files by name; binaries must be executable,
// the licence files not.
func tarFiles(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	must.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	must.NoError(t, err)
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		must.NoError(t, err)
		mode := int64(0o755)
		if h.Name == "LICENSE" || h.Name == "THIRD_PARTY_LICENSES" {
			mode = 0o644
		}
		must.Eq(t, mode, h.Mode&0o777, must.Sprintf("%s has mode %o", h.Name, h.Mode))
		b, err := io.ReadAll(tr)
		must.NoError(t, err)
		files[h.Name] = string(b)
	}
}

func TestDistTarballAndChecksums(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	runDist(t, dir)

	name := "oasis_v0.0.0-test_linux_" + runtime.GOARCH + ".tar.gz"
	files := tarFiles(t, filepath.Join(dir, name))
	must.MapLen(t, 3, files)
	must.MapContainsKeys(t, files, []string{"oasis-sim", "LICENSE", "THIRD_PARTY_LICENSES"})
	must.StrContains(t, files["LICENSE"], "Apache License")
	// The listing names what oasis-sim links, with its licence and text, and nothing it does not.
	notice := files["THIRD_PARTY_LICENSES"]
	must.RegexMatch(t, regexp.MustCompile(`(?m)^github.com/prometheus/client_golang +v\S+ +Apache-2.0$`), notice)
	must.StrContains(t, notice, "github.com/prometheus/client_golang v")
	must.StrNotContains(t, notice, "github.com/hashicorp/nomad ")

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

// The other release architecture builds on this machine too: its binaries are for that machine, and
// its licence listing comes from the check run here (a check built for the target could not run).
func TestDistOtherArchitecture(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	arch, machine := "arm64", elf.EM_AARCH64
	if runtime.GOARCH == "arm64" {
		arch, machine = "amd64", elf.EM_X86_64
	}
	dir := t.TempDir()
	runDistArch(t, dir, arch)
	files := tarFiles(t, filepath.Join(dir, "oasis_v0.0.0-test_linux_"+arch+".tar.gz"))
	must.MapContainsKeys(t, files, []string{"oasis-sim", "LICENSE", "THIRD_PARTY_LICENSES"})
	bin, err := elf.NewFile(strings.NewReader(files["oasis-sim"]))
	must.NoError(t, err)
	must.Eq(t, machine, bin.Machine)
	must.RegexMatch(t, regexp.MustCompile(`(?m)^github.com/prometheus/client_golang +v\S+ +Apache-2.0$`), files["THIRD_PARTY_LICENSES"])
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
