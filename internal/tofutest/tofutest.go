// Package tofutest runs the real OpenTofu CLI (bin/tofu from `make
// hashistack`) on a module for tests: init from a filesystem mirror holding
// the freshly built Oasis provider (no network, no registry), then plan,
// apply, show and destroy, with the plan's resource changes decoded from
// `tofu show -json`.
package tofutest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// ProviderPackage is the provider command's import path.
const ProviderPackage = "github.com/oasis-llm/oasis/cmd/terraform-provider-oasis"

// The provider's source address, type and version as the provider package
// declares them (ProviderAddress, ProviderVersion; the provider's
// tests import this package, so it cannot import the provider, and a test
// there checks they agree).
const (
	ProviderAddress = "registry.opentofu.org/oasis-llm/oasis"
	ProviderVersion = "0.1.0"
	providerType    = "oasis"
)

// Binary finds tofu: $OASIS_TOFU_BIN or the repository's bin/tofu; "" when
// there is none.
func Binary() string {
	if p := os.Getenv("OASIS_TOFU_BIN"); p != "" {
		return p
	}
	root, err := repoRoot()
	if err != nil {
		return ""
	}
	p := filepath.Join(root, "bin", "tofu")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = parent
	}
}

// RepoPath is a path below the repository root.
func RepoPath(t testing.TB, elem ...string) string {
	t.Helper()
	root, err := repoRoot()
	must.NoError(t, err)
	return filepath.Join(append([]string{root}, elem...)...)
}

// Tofu is one working directory and the environment tofu runs in.
type Tofu struct {
	t   testing.TB
	Bin string
	// Dir is the root module tofu runs in.
	Dir string
	// Env is added to the process's environment for every command.
	Env []string
}

// Options say what a Tofu needs.
type Options struct {
	// Module is copied into a fresh directory that becomes Dir (its .tf and
	// .tftest.hcl files and subdirectories, not .terraform or state).
	Module string
	// Provider is a built terraform-provider-oasis; empty builds one when
	// WithProvider is set.
	Provider     string
	WithProvider bool
	// Env is added to every command's environment (NOMAD_ADDR, tokens...).
	Env []string
}

// New prepares a working directory. Without tofu the test is skipped
// (failed under CI). With WithProvider, the CLI configuration installs
// oasis-llm/oasis only from a filesystem mirror holding the given build and
// every other provider from nowhere: a module that needs one fails init.
func New(t testing.TB, opts Options) *Tofu {
	t.Helper()
	bin := Binary()
	if bin == "" {
		testutil.SkipUnlessCI(t, "no tofu binary: set OASIS_TOFU_BIN or run make hashistack (bin/tofu)")
	}
	work := t.TempDir()
	dir := filepath.Join(work, "module")
	must.NoError(t, os.CopyFS(dir, os.DirFS(opts.Module)))
	must.NoError(t, os.RemoveAll(filepath.Join(dir, ".terraform")))
	env := append([]string{
		"TF_IN_AUTOMATION=1",
		"TF_INPUT=0",
		"CHECKPOINT_DISABLE=1",
		"TF_DATA_DIR=" + filepath.Join(work, "data"),
		"TF_PLUGIN_CACHE_DIR=",
	}, opts.Env...)
	cfg := filepath.Join(work, "tofurc")
	mirror := filepath.Join(work, "mirror")
	if opts.WithProvider || opts.Provider != "" {
		provBin := opts.Provider
		if provBin == "" {
			provBin = testutil.BuildCommand(t, ProviderPackage)
		}
		installProvider(t, mirror, provBin)
	}
	must.NoError(t, os.WriteFile(cfg, []byte(cliConfig(mirror)), 0o600))
	env = append(env, "TF_CLI_CONFIG_FILE="+cfg)
	return &Tofu{t: t, Bin: bin, Dir: dir, Env: env}
}

func cliConfig(mirror string) string {
	return fmt.Sprintf(`provider_installation {
  filesystem_mirror {
    path    = %q
    include = [%q]
  }
}
`, mirror, ProviderAddress)
}

// installProvider lays out the mirror as tofu's unpacked layout:
// <mirror>/<host>/<ns>/<type>/<version>/<os_arch>/terraform-provider-<type>.
func installProvider(t testing.TB, mirror, bin string) {
	t.Helper()
	dir := filepath.Join(mirror, filepath.FromSlash(ProviderAddress), ProviderVersion,
		runtime.GOOS+"_"+runtime.GOARCH)
	must.NoError(t, os.MkdirAll(dir, 0o755))
	data, err := os.ReadFile(bin)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(filepath.Join(dir, "terraform-provider-"+providerType+"_v"+ProviderVersion), data, 0o755))
}

// Run runs one tofu command in Dir and returns its stdout; the error
// carries stderr.
func (tf *Tofu) Run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, tf.Bin, args...)
	cmd.Dir = tf.Dir
	cmd.Env = append(os.Environ(), tf.Env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("tofu %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// Must runs a command that has to succeed.
func (tf *Tofu) Must(ctx context.Context, args ...string) string {
	tf.t.Helper()
	out, err := tf.Run(ctx, args...)
	must.NoError(tf.t, err)
	return out
}

// Init runs `tofu init` (from the mirror only).
func (tf *Tofu) Init(ctx context.Context) { tf.t.Helper(); tf.Must(ctx, "init", "-no-color") }

// Change is one entry of a plan's resource_changes.
type Change struct {
	Address string `json:"address"`
	Mode    string `json:"mode"`
	Type    string `json:"type"`
	Name    string `json:"name"`
	Change  struct {
		Actions []string       `json:"actions"`
		Before  map[string]any `json:"before"`
		After   map[string]any `json:"after"`
	} `json:"change"`
}

// Plan is the part of `tofu show -json <plan>` tests read.
type Plan struct {
	ResourceChanges []Change `json:"resource_changes"`
	ResourceDrift   []Change `json:"resource_drift"`
}

// Changed are the changes whose actions are not just "no-op" or "read".
func (p *Plan) Changed() []Change {
	var out []Change
	for _, c := range p.ResourceChanges {
		if len(c.Change.Actions) == 1 && (c.Change.Actions[0] == "no-op" || c.Change.Actions[0] == "read") {
			continue
		}
		out = append(out, c)
	}
	return out
}

// Plan runs `tofu plan -out` with args (-var ... ) and decodes the plan.
func (tf *Tofu) Plan(ctx context.Context, args ...string) (*Plan, error) {
	planFile := filepath.Join(filepath.Dir(tf.Dir), "plan.tfplan")
	if _, err := tf.Run(ctx, append([]string{"plan", "-no-color", "-out", planFile}, args...)...); err != nil {
		return nil, err
	}
	out, err := tf.Run(ctx, "show", "-json", planFile)
	if err != nil {
		return nil, err
	}
	var p Plan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("decoding plan: %w", err)
	}
	return &p, nil
}

// Output reads one root output as JSON into v.
func (tf *Tofu) Output(ctx context.Context, name string, v any) error {
	out, err := tf.Run(ctx, "output", "-json", name)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(out), v)
}
