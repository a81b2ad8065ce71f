package licenses

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Module is one module of a graph with the licences read from its files.
type Module struct {
	Path    string
	Version string
	Dir     string
	// Files are the licence files found at the module's root, by name.
	Files map[string]string
	// Kinds are the licences recognised in Files, sorted.
	Kinds []Kind
	// Linked is true when a package of the module is built into a package
	// or test of the main module (go list -deps -test ./...).
	Linked bool
	// Problem says why the module fails the check; empty when it passes.
	Problem string
}

// Main reports whether m is the main module.
func (m Module) Main() bool { return m.Version == "" }

// ID is path@version, or the path alone for the main module.
func (m Module) ID() string {
	if m.Version == "" {
		return m.Path
	}
	return m.Path + "@" + m.Version
}

// ErrRefused is returned by Check when a module's licence is not allowed.
var ErrRefused = errors.New("module licences not allowed")

// RefusedError names every module that failed the check.
type RefusedError struct{ Modules []Module }

func (e *RefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d module(s) with licences Oasis may not link:", len(e.Modules))
	for _, m := range e.Modules {
		fmt.Fprintf(&b, "\n  %s: %s", m.ID(), m.Problem)
	}
	return b.String()
}

func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// maxLicenseBytes bounds what is read of one licence file.
const maxLicenseBytes = 1 << 20

// verdict sets m.Kinds and m.Problem from m.Files.
func (m *Module) verdict() {
	if len(m.Files) == 0 && (m.Linked || m.Main()) {
		m.Problem = "no licence file (LICENSE, LICENCE, COPYING, UNLICENSE) at the module root"
		return
	}
	var kinds []Kind
	for _, text := range m.Files {
		for _, k := range Classify(text) {
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
	}
	slices.Sort(kinds)
	m.Kinds = kinds
	allowed := false
	for _, k := range kinds {
		if k.Forbidding() {
			m.Problem = fmt.Sprintf("licensed under %s, which is not an open-source licence Oasis may link", k)
			return
		}
		allowed = allowed || k.Allowed()
	}
	switch {
	case !m.Linked && !m.Main():
		// Only its go.mod is in the graph: nothing of it can be built into
		// an Oasis binary. A licence that forbids (above) still fails.
	case len(kinds) == 0:
		m.Problem = "licence not recognised in " + strings.Join(fileNames(m.Files), ", ")
	case !allowed:
		m.Problem = fmt.Sprintf("licensed under %s only; allowed: Apache-2.0, MIT, BSD, ISC, MPL-2.0, Unlicense, Zlib, BSL-1.0, CC0-1.0", joinKinds(kinds))
	}
}

func fileNames(files map[string]string) []string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func joinKinds(kinds []Kind) string {
	s := make([]string, len(kinds))
	for i, k := range kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// isLicenseFile reports whether a file name at a module root holds a
// licence.
func isLicenseFile(name string) bool {
	n := strings.ToLower(name)
	if strings.HasSuffix(n, ".go") {
		return false
	}
	for _, p := range []string{"license", "licence", "copying", "unlicense"} {
		if n == p || strings.HasPrefix(n, p+".") || strings.HasPrefix(n, p+"-") || strings.HasPrefix(n, p+"_") {
			return true
		}
	}
	return false
}

// readLicenses reads the licence files at dir.
func readLicenses(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading module directory: %w", err)
	}
	files := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !isLicenseFile(e.Name()) {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(io.LimitReader(f, maxLicenseBytes))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", e.Name(), err)
		}
		files[e.Name()] = string(b)
	}
	return files, nil
}

// mainLicenses reads the main module's licence files: at its root, or for
// a module nested in a repository (bench/llmd) in the nearest directory
// above that has any.
func mainLicenses(dir string) (map[string]string, error) {
	for {
		files, err := readLicenses(dir)
		if err != nil || len(files) > 0 {
			return files, err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return files, nil
		}
		dir = parent
	}
}

// goModule is what `go list -m -json` and `go mod download -json` print.
type goModule struct {
	Path    string
	Version string
	Dir     string
	Main    bool
	Error   any
	Replace *goModule
}

// Graph lists the modules of `go list -m all` run in dir (the main module
// included), downloading those whose source is not in the module cache
// yet, with the licences of each read and judged.
func Graph(ctx context.Context, dir string) ([]Module, error) {
	listed, err := goJSON(ctx, dir, "list", "-m", "-json", "all")
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, g := range listed {
		if src := source(g); src.Dir == "" && !g.Main {
			missing = append(missing, src.Path+"@"+src.Version)
		}
	}
	linked, err := Linked(ctx, dir, "-test", "./...")
	if err != nil {
		return nil, err
	}
	dirs, err := download(ctx, dir, missing)
	if err != nil {
		return nil, err
	}
	modCache := ""
	if out, err := goCmd(ctx, dir, "env", "GOMODCACHE"); err == nil {
		modCache = strings.TrimSpace(string(out))
	}
	mods := make([]Module, 0, len(listed))
	for _, g := range listed {
		src := source(g)
		m := Module{Path: g.Path, Version: g.Version, Dir: src.Dir, Linked: linked[g.Path]}
		if m.Dir == "" {
			m.Dir = dirs[src.Path+"@"+src.Version]
		}
		if m.Dir == "" {
			m.Dir = cachedDir(modCache, src.Path, src.Version)
		}
		if m.Dir == "" {
			if m.Linked {
				return nil, fmt.Errorf("module %s: no source directory after download", m.ID())
			}
			// Only its go.mod is in the graph and its source cannot be had
			// (e.g. the checksum database lacks it): nothing of it is built.
			m.deny()
			mods = append(mods, m)
			continue
		}
		if g.Main {
			m.Files, err = mainLicenses(m.Dir)
		} else {
			m.Files, err = readLicenses(m.Dir)
		}
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", m.ID(), err)
		}
		m.verdict()
		m.deny()
		mods = append(mods, m)
	}
	return mods, nil
}

// download fetches the given path@version modules and returns their
// directories. A module the go command cannot download (e.g. a pseudo
// version the checksum database has no entry for, when go.sum lacks it) is
// looked up in the module cache, where a build of another module may have
// put it verified; else it has no directory.
func download(ctx context.Context, dir string, missing []string) (map[string]string, error) {
	dirs := map[string]string{}
	for len(missing) > 0 {
		n := min(len(missing), 64)
		out, runErr := goCmd(ctx, dir, append([]string{"mod", "download", "-json"}, missing[:n]...)...)
		dec := json.NewDecoder(bytes.NewReader(out))
		for dec.More() {
			var g goModule
			if err := dec.Decode(&g); err != nil {
				return nil, fmt.Errorf("go mod download: decoding output: %w (%v)", err, runErr)
			}
			if g.Dir != "" {
				dirs[g.Path+"@"+g.Version] = g.Dir
			}
		}
		missing = missing[n:]
	}
	return dirs, nil
}

// cachedDir is where the module cache (modCache, "" when unknown) keeps
// path@version, if it is there.
func cachedDir(modCache, path, version string) string {
	if modCache == "" {
		return ""
	}
	d := filepath.Join(modCache, escape(path)+"@"+escape(version))
	if st, err := os.Stat(d); err == nil && st.IsDir() {
		return d
	}
	return ""
}

// escape is the module cache's case encoding: an upper-case letter becomes
// "!" and its lower case.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// source is the module whose files are used: the replacement, if any.
func source(g goModule) goModule {
	if g.Replace != nil {
		r := *g.Replace
		if r.Dir == "" && r.Version == "" {
			r.Dir = g.Dir
		}
		return r
	}
	return g
}

// Check judges every module of `go list -m all` in dir; the error is a
// *RefusedError (errors.Is ErrRefused) naming each module that fails.
func Check(ctx context.Context, dir string) ([]Module, error) {
	mods, err := Graph(ctx, dir)
	if err != nil {
		return nil, err
	}
	var refused []Module
	for _, m := range mods {
		if m.Problem != "" {
			refused = append(refused, m)
		}
	}
	if len(refused) > 0 {
		return mods, &RefusedError{Modules: refused}
	}
	return mods, nil
}

// Linked returns the module paths whose packages the given packages link
// (go list -deps; "-test" among pkgs adds their tests' dependencies), the
// main module left out.
func Linked(ctx context.Context, dir string, pkgs ...string) (map[string]bool, error) {
	args := append([]string{"list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}}{{end}}{{end}}"}, pkgs...)
	out, err := goCmd(ctx, dir, args...)
	if err != nil {
		return nil, err
	}
	linked := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			linked[l] = true
		}
	}
	return linked, nil
}

func goJSON(ctx context.Context, dir string, args ...string) ([]goModule, error) {
	out, err := goCmd(ctx, dir, args...)
	if err != nil {
		return nil, err
	}
	var mods []goModule
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var g goModule
		if err := dec.Decode(&g); err != nil {
			return nil, fmt.Errorf("go %s: decoding output: %w", args[0], err)
		}
		if g.Error != nil {
			return nil, fmt.Errorf("go %s: module %s@%s: %v", args[0], g.Path, g.Version, g.Error)
		}
		mods = append(mods, g)
	}
	return mods, nil
}

func goCmd(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
