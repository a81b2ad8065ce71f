package node

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tofutest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// stubRelease serves a tarball shaped like a release (the llm driver plugin and a command, both
// stub scripts) and returns its URL and SHA-256.
func stubRelease(t *testing.T) (url, sum string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, name := range []string{"nomad-driver-llm", "oasis-sim"} {
		body := []byte("#!/bin/sh\necho " + name + "\n")
		must.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write(body)
		must.NoError(t, err)
	}
	must.NoError(t, tw.Close())
	must.NoError(t, gz.Close())
	data := buf.Bytes()
	h := sha256.Sum256(data)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(data) }))
	t.Cleanup(srv.Close)
	return srv.URL + "/oasis.tar.gz", hex.EncodeToString(h[:])
}

// TestInstallScriptFormatsAndMountsKvcachedDisk gives the rendered install script a blank block
// device (a loop device over a file): it makes the filesystem, records the device in the fstab by
// UUID and mounts it on kvcached_dir; run again on the unmounted disk, it mounts the same
// filesystem without formatting it again.
func TestInstallScriptFormatsAndMountsKvcachedDisk(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipUnlessCI(t, "loop devices and mounts need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	must.NoError(t, os.WriteFile(img, nil, 0o600))
	must.NoError(t, os.Truncate(img, 64<<20))
	out, err := exec.Command("losetup", "-f", "--show", img).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	dev := strings.TrimSpace(string(out))
	kvDir, fstab := filepath.Join(dir, "kvcached"), filepath.Join(dir, "fstab")
	must.NoError(t, os.WriteFile(fstab, []byte("# test fstab\n"), 0o644))
	// Cleanups run last-in first-out: unmount, then detach the loop device.
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("detaching %s: %v %s", dev, err, out)
		}
	})
	t.Cleanup(func() {
		if len(mountsUnder(t, dir)) > 0 {
			if out, err := exec.Command("umount", kvDir).CombinedOutput(); err != nil {
				t.Errorf("unmounting %s: %v %s", kvDir, err, out)
			}
		}
	})

	url, sum := stubRelease(t)
	tf := tofutest.New(t, tofutest.Options{Module: filepath.Join(root, "terraform", "modules", "nomad-gpu-client")})
	tf.Init(ctx)
	tf.Must(ctx, "apply", "-auto-approve", "-no-color",
		"-var", "oasis_release_url="+url, "-var", "oasis_release_sha256="+sum, "-var", "allow_insecure_download=true",
		"-var", "install_prefix="+filepath.Join(dir, "prefix"), "-var", "nomad_plugin_dir="+filepath.Join(dir, "plugins"),
		"-var", "gpu_device_plugin=false", "-var", `consul_retry_join=["127.0.0.1:1"]`,
		"-var", "kvcached_dir="+kvDir, "-var", "kvcached_device="+dev, "-var", "kvcached_filesystem=ext4",
		"-var", "fstab_path="+fstab)
	var script string
	must.NoError(t, tf.Output(ctx, "install_script", &script))
	path := filepath.Join(dir, "install.sh")
	must.NoError(t, os.WriteFile(path, []byte(script), 0o755))

	out, err = exec.CommandContext(ctx, "/bin/bash", path).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "making a ext4 filesystem on "+dev)
	must.Eq(t, []string{kvDir}, mountsUnder(t, dir))
	uuid, err := exec.Command("blkid", "-p", "-o", "value", "-s", "UUID", dev).Output()
	must.NoError(t, err)
	line := "UUID=" + strings.TrimSpace(string(uuid)) + " " + kvDir + " ext4 defaults,nofail,noatime 0 2\n"
	data, err := os.ReadFile(fstab)
	must.NoError(t, err)
	must.Eq(t, "# test fstab\n"+line, string(data))
	_, err = os.Stat(filepath.Join(dir, "plugins", "nomad-driver-llm"))
	must.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "prefix", "bin", "oasis-sim"))
	must.NoError(t, err)

	// Data on the disk survives a second run: mounted again, not formatted again.
	must.NoError(t, os.WriteFile(filepath.Join(kvDir, "marker"), []byte("kept"), 0o644))
	out, err = exec.Command("umount", kvDir).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.SliceEmpty(t, mountsUnder(t, dir))
	out, err = exec.CommandContext(ctx, "/bin/bash", path).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrNotContains(t, string(out), "making a")
	must.Eq(t, []string{kvDir}, mountsUnder(t, dir))
	marker, err := os.ReadFile(filepath.Join(kvDir, "marker"))
	must.NoError(t, err)
	must.Eq(t, "kept", string(marker))
	data, err = os.ReadFile(fstab)
	must.NoError(t, err)
	must.Eq(t, "# test fstab\n"+line, string(data))
}
