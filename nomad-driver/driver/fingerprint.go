package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"

	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/render"
)

// probedEngines are the engines with a local binary (openai_compat has none).
var probedEngines = []string{config.EngineVLLM, config.EngineSGLang, config.EngineLlamaCpp, config.EngineTRTLLM, config.EngineSim}

// versionTimeout bounds one engine's version command (Python engines import slowly).
const versionTimeout = 20 * time.Second

func (d *Driver) Fingerprint(ctx context.Context) (<-chan *drivers.Fingerprint, error) {
	ch := make(chan *drivers.Fingerprint)
	go d.fingerprintLoop(ctx, ch)
	return ch, nil
}

func (d *Driver) fingerprintLoop(ctx context.Context, ch chan<- *drivers.Fingerprint) {
	defer close(ch)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		case <-timer.C:
		case <-d.fingerprintNow:
		}
		fp := d.buildFingerprint(ctx)
		select {
		case ch <- fp:
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		}
		d.mu.RLock()
		period := d.period
		d.mu.RUnlock()
		timer.Reset(period)
	}
}

func (d *Driver) buildFingerprint(ctx context.Context) *drivers.Fingerprint {
	pc, _ := d.pluginConfig()
	attrs := map[string]*structs.Attribute{}
	var found []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, engine := range probedEngines {
		wg.Go(func() {
			path, err := resolveBinary(engine, "", pc)
			if err != nil {
				return
			}
			version, err := d.probe.version(ctx, engine, path)
			if err != nil {
				var first *loggedOnce
				if !errors.As(err, &first) {
					return // already logged when it was first probed
				}
				d.logger.Warn("engine binary found but its version command failed; not advertising it",
					"engine", engine, "path", path, "error", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			attrs["driver.llm."+engine+".version"] = structs.NewStringAttribute(version)
			found = append(found, engine+" "+version)
		})
	}
	wg.Wait()
	if len(found) == 0 {
		return &drivers.Fingerprint{
			Attributes: attrs,
			Health:     drivers.HealthStateUndetected,
			HealthDescription: "no inference engine found (looked for vllm, python3 with sglang, llama-server, trtllm-serve, " +
				"oasis-sim on PATH and in the plugin's binaries map)",
		}
	}
	slices.Sort(found)
	return &drivers.Fingerprint{
		Attributes:        attrs,
		Health:            drivers.HealthStateHealthy,
		HealthDescription: "engines: " + strings.Join(found, ", "),
	}
}

// resolveBinary picks the engine executable: the task's "binary", the
// plugin's binaries[engine], or the engine's default name on PATH.
func resolveBinary(engine, taskBinary string, pc config.PluginConfig) (string, error) {
	name := taskBinary
	if name == "" {
		name = pc.Binaries[engine]
	}
	if name == "" {
		name = render.DefaultBinary(engine)
	}
	if name == "" {
		return "", fmt.Errorf("engine %s has no binary", engine)
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("engine %s: binary %q not found or not executable: %w", engine, name, err)
	}
	return filepath.Abs(path)
}

// prober caches version probes per binary, keyed by path, size and mtime,
// so a fingerprint every 30 s does not re-import Python engines.
type prober struct {
	mu    sync.Mutex
	cache map[string]probeResult
}

type probeResult struct {
	size    int64
	modTime time.Time
	version string
	err     error // failures are cached too: no re-import every period
}

func newProber() *prober { return &prober{cache: map[string]probeResult{}} }

func (p *prober) version(ctx context.Context, engine, path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	key := engine + "\x00" + path
	p.mu.Lock()
	if r, ok := p.cache[key]; ok && r.size == fi.Size() && r.modTime.Equal(fi.ModTime()) {
		p.mu.Unlock()
		return r.version, r.err
	}
	p.mu.Unlock()
	v, err := runVersion(ctx, engine, path)
	if err != nil && ctx.Err() != nil {
		return "", err // cancelled: do not cache
	}
	p.mu.Lock()
	p.cache[key] = probeResult{size: fi.Size(), modTime: fi.ModTime(), version: v, err: err}
	p.mu.Unlock()
	if err != nil {
		return "", &loggedOnce{err}
	}
	return v, nil
}

// loggedOnce marks the first report of a cached probe failure.
type loggedOnce struct{ error }

func (e *loggedOnce) Unwrap() error { return e.error }

func runVersion(ctx context.Context, engine, path string) (string, error) {

	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	args := []string{"--version"}
	if engine == config.EngineSGLang && strings.HasPrefix(filepath.Base(path), "python") {
		args = []string{"-c", "import sglang; print(sglang.__version__)"}
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "", fmt.Errorf("%s %s timed out after %s", path, strings.Join(args, " "), versionTimeout)
		}
		return "", fmt.Errorf("%s %s: %w: %s", path, strings.Join(args, " "), err, tail(string(out), 3))
	}
	return parseVersion(string(out)), nil
}

var versionRE = regexp.MustCompile(`\bv?(\d+(?:\.\d+)*(?:[-+.]?[0-9A-Za-z][0-9A-Za-z.+-]*)?)`)

// parseVersion finds the first version-looking token ("0.11.0",
// "1.2.0rc1", llama.cpp's build number); "unknown" when there is none.
func parseVersion(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if m := versionRE.FindStringSubmatch(line); m != nil {
			return m[1]
		}
	}
	return "unknown"
}

// tail returns the last n non-empty lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	var out []string
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}
