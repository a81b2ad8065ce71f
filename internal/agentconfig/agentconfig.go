// Package agentconfig loads the daemons' configuration files the way
// HashiCorp agents take theirs: -config FILE|DIR, repeatable, each file HCL
// (.hcl) or JSON (.json, HCL's JSON syntax, so one schema serves both). A
// directory contributes its *.hcl and *.json files in lexical order; later
// files override earlier ones, and a flag given on the command line
// overrides every file.
//
// A file is a set of keys, each mapped to the flag it stands for (Key):
// loading a file sets those flags on the daemon's flag.FlagSet, so a key
// means exactly what its flag means, with the flag's default and the
// flag's validation. Unknown keys and blocks, values of the wrong type,
// durations and byte sizes that do not parse are errors naming the key and
// the file:line of the value.
package agentconfig

import (
	"errors"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// Kind is the type of a key's value in a file.
type Kind int

// The kinds of value a key takes.
const (
	String   Kind = iota // a string
	Bool                 // true or false
	Int                  // a whole number
	Float                // a number
	Duration             // a string time.ParseDuration takes: "10s", "1m30s"
	Bytes                // a byte size: a whole number, or a string such as "512MiB", "8GiB"
	List                 // a list of strings (the flag takes them comma-separated)
)

func (k Kind) String() string {
	switch k {
	case String:
		return "a string"
	case Bool:
		return "true or false"
	case Int:
		return "a whole number"
	case Float:
		return "a number"
	case Duration:
		return `a duration string such as "10s"`
	case Bytes:
		return `a byte size such as 1048576 or "8GiB"`
	case List:
		return "a list of strings"
	}
	return "a value"
}

// Key is one setting of a config file and the flag it sets.
type Key struct {
	// Block is the block holding the key: "" at the top level, "tls", or
	// "telemetry.tracing" for a block inside a block.
	Block string
	Name  string // the key inside its block, e.g. "max_body_bytes"
	Flag  string // the flag it sets, without dashes, e.g. "max-body-bytes"
	Kind  Kind
}

// Path is the key's full name, e.g. "limits.max_body_bytes".
func (k Key) Path() string {
	if k.Block == "" {
		return k.Name
	}
	return k.Block + "." + k.Name
}

// Paths is a repeatable -config flag: each use adds a file or directory.
type Paths []string

func (p *Paths) String() string { return strings.Join(*p, ",") }

// Set adds one -config argument.
func (p *Paths) Set(s string) error {
	if s == "" {
		return errors.New("empty path")
	}
	*p = append(*p, s)
	return nil
}

// Usage is the -config flag's help text.
const Usage = "load settings from `FILE|DIR`: an HCL (.hcl) or JSON (.json) file, or a directory's *.hcl and *.json files in lexical order; repeatable, later files override earlier ones and flags given on the command line override every file"

// Files expands -config arguments into files in load order: a file as is
// (whatever its extension), a directory's *.hcl and *.json files in
// lexical order. A directory with no config file in it is not an error
// (Nomad and Consul agents accept an empty config directory).
func Files(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("-config: %w", err)
		}
		if !fi.IsDir() {
			out = append(out, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("-config: %w", err)
		}
		var names []string
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if e.Type().IsRegular() && (ext == ".hcl" || ext == ".json") {
				names = append(names, e.Name())
			}
		}
		sort.Strings(names)
		for _, n := range names {
			out = append(out, filepath.Join(p, n))
		}
	}
	return out, nil
}

// Setting is one key found in a file: the flag value it stands for.
type Setting struct {
	Key   Key
	Value string    // the flag's argument, e.g. "10s", "1048576", "a,b"
	Range hcl.Range // where the value is, for errors
}

// Parse reads one file's settings, in file order. Files named *.json are
// read as HCL's JSON syntax, any other as HCL native syntax.
func Parse(keys []Key, filename string, src []byte) ([]Setting, error) {
	p := hclparse.NewParser()
	var f *hcl.File
	var diags hcl.Diagnostics
	if strings.HasSuffix(filename, ".json") {
		f, diags = p.ParseJSON(src, filename)
	} else {
		f, diags = p.ParseHCL(src, filename)
	}
	if diags.HasErrors() {
		return nil, diagError(diags)
	}
	var out []Setting
	if diags := decodeBody(f.Body, "", index(keys), &out); diags.HasErrors() {
		return nil, diagError(diags)
	}
	sort.SliceStable(out, func(i, j int) bool { return before(out[i].Range, out[j].Range) })
	return out, nil
}

func before(a, b hcl.Range) bool {
	return a.Start.Byte < b.Start.Byte
}

// keyIndex is the keys by block: the attributes of each block and the
// blocks inside it.
type keyIndex struct {
	attrs  map[string]map[string]Key // block path → name → key
	blocks map[string][]string       // block path → child block names
}

func index(keys []Key) keyIndex {
	ix := keyIndex{attrs: map[string]map[string]Key{}, blocks: map[string][]string{}}
	seen := map[string]bool{}
	for _, k := range keys {
		if ix.attrs[k.Block] == nil {
			ix.attrs[k.Block] = map[string]Key{}
		}
		ix.attrs[k.Block][k.Name] = k
		// Register the block and its parents as children of theirs.
		for b := k.Block; b != "" && !seen[b]; {
			seen[b] = true
			parent, name := "", b
			if i := strings.LastIndexByte(b, '.'); i >= 0 {
				parent, name = b[:i], b[i+1:]
			}
			ix.blocks[parent] = append(ix.blocks[parent], name)
			b = parent
		}
	}
	return ix
}

func decodeBody(body hcl.Body, path string, ix keyIndex, out *[]Setting) hcl.Diagnostics {
	schema := &hcl.BodySchema{}
	for name := range ix.attrs[path] {
		schema.Attributes = append(schema.Attributes, hcl.AttributeSchema{Name: name})
	}
	for _, name := range ix.blocks[path] {
		schema.Blocks = append(schema.Blocks, hcl.BlockHeaderSchema{Type: name})
	}
	content, diags := body.Content(schema)
	if diags.HasErrors() {
		for _, d := range diags {
			if path != "" {
				d.Detail = "In block " + path + ": " + d.Detail
			}
		}
		return diags
	}
	for name, attr := range content.Attributes {
		s, d := setting(ix.attrs[path][name], attr)
		if d != nil {
			diags = append(diags, d)
			continue
		}
		*out = append(*out, s)
	}
	seen := map[string]*hcl.Block{}
	for _, b := range content.Blocks {
		if first := seen[b.Type]; first != nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Duplicate block",
				Detail:  fmt.Sprintf("%s: a second %q block; the first is at %s (one per file: put its keys in one block)", join(path, b.Type), b.Type, first.DefRange),
				Subject: b.DefRange.Ptr()})
			continue
		}
		seen[b.Type] = b
		diags = append(diags, decodeBody(b.Body, join(path, b.Type), ix, out)...)
	}
	return diags
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// setting converts one attribute's value to its flag's argument.
func setting(k Key, attr *hcl.Attribute) (Setting, *hcl.Diagnostic) {
	rng := attr.Expr.Range()
	bad := func(format string, args ...any) *hcl.Diagnostic {
		return &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid value for " + k.Path(),
			Detail: k.Path() + ": " + fmt.Sprintf(format, args...), Subject: &rng}
	}
	v, diags := attr.Expr.Value(nil)
	if diags.HasErrors() {
		return Setting{}, bad("want %s: %s", k.Kind, diagText(diags))
	}
	if v.IsNull() || !v.IsWhollyKnown() {
		return Setting{}, bad("want %s, got null", k.Kind)
	}
	s := Setting{Key: k, Range: rng}
	switch k.Kind {
	case String, Duration:
		sv, err := convert.Convert(v, cty.String)
		if err != nil || (k.Kind == Duration && v.Type() != cty.String) {
			return s, bad("want %s, got %s", k.Kind, v.Type().FriendlyName())
		}
		s.Value = sv.AsString()
		if k.Kind == Duration {
			d, err := time.ParseDuration(s.Value)
			if err != nil {
				return s, bad("want %s: %v", k.Kind, err)
			}
			s.Value = d.String()
		}
	case Bool:
		if v.Type() != cty.Bool {
			return s, bad("want %s, got %s", k.Kind, v.Type().FriendlyName())
		}
		s.Value = strconv.FormatBool(v.True())
	case Int:
		n, err := wholeNumber(v)
		if err != nil {
			return s, bad("want %s: %v", k.Kind, err)
		}
		s.Value = strconv.FormatInt(n, 10)
	case Float:
		if v.Type() != cty.Number {
			return s, bad("want %s, got %s", k.Kind, v.Type().FriendlyName())
		}
		f, _ := v.AsBigFloat().Float64()
		s.Value = strconv.FormatFloat(f, 'g', -1, 64)
	case Bytes:
		var n int64
		var err error
		switch v.Type() {
		case cty.String:
			n, err = ParseBytes(v.AsString())
		case cty.Number:
			n, err = wholeNumber(v)
			if err == nil && n < 0 {
				err = errors.New("negative")
			}
		default:
			err = fmt.Errorf("got %s", v.Type().FriendlyName())
		}
		if err != nil {
			return s, bad("want %s: %v", k.Kind, err)
		}
		s.Value = strconv.FormatInt(n, 10)
	case List:
		if v.Type() == cty.String {
			s.Value = v.AsString()
			break
		}
		if !v.Type().IsListType() && !v.Type().IsTupleType() && !v.Type().IsSetType() {
			return s, bad("want %s, got %s", k.Kind, v.Type().FriendlyName())
		}
		var items []string
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			if e.IsNull() || e.Type() != cty.String {
				return s, bad("want %s: an item is %s", k.Kind, e.Type().FriendlyName())
			}
			item := e.AsString()
			if strings.Contains(item, ",") {
				return s, bad("item %q: no commas inside an item", item)
			}
			items = append(items, item)
		}
		s.Value = strings.Join(items, ",")
	default:
		return s, bad("unknown kind %d", k.Kind)
	}
	return s, nil
}

func wholeNumber(v cty.Value) (int64, error) {
	if v.Type() != cty.Number {
		return 0, fmt.Errorf("got %s", v.Type().FriendlyName())
	}
	bf := v.AsBigFloat()
	if !bf.IsInt() {
		return 0, fmt.Errorf("%s is not whole", bf.Text('g', 10))
	}
	n, acc := bf.Int64()
	if acc != big.Exact {
		return 0, fmt.Errorf("%s is out of range", bf.Text('g', 10))
	}
	return n, nil
}

// Apply loads the files of paths (Files) in order and sets on fs the flag
// of each key they hold, except the flags the command line set: call it
// after fs.Parse. Errors name the file:line and the key.
func Apply(fs *flag.FlagSet, keys []Key, paths []string) error {
	if len(paths) == 0 {
		return nil
	}
	cmdline := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { cmdline[f.Name] = true })
	files, err := Files(paths)
	if err != nil {
		return err
	}
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("-config: %w", err)
		}
		settings, err := Parse(keys, name, src)
		if err != nil {
			return err
		}
		for _, s := range settings {
			if cmdline[s.Key.Flag] {
				continue
			}
			if err := fs.Set(s.Key.Flag, s.Value); err != nil {
				return fmt.Errorf("%s: %s (flag -%s): invalid value %q: %w", s.Range, s.Key.Path(), s.Key.Flag, s.Value, err)
			}
		}
	}
	return nil
}

// Check reports keys whose flag fs does not define, and flags of fs that
// no key sets other than those named in except: a test of each daemon's
// key table calls it so that no flag is left out of the file.
func Check(fs *flag.FlagSet, keys []Key, except ...string) error {
	var errs []error
	byFlag := map[string]bool{}
	paths := map[string]bool{}
	for _, k := range keys {
		if fs.Lookup(k.Flag) == nil {
			errs = append(errs, fmt.Errorf("key %s: no flag -%s", k.Path(), k.Flag))
		}
		if byFlag[k.Flag] {
			errs = append(errs, fmt.Errorf("key %s: flag -%s set by two keys", k.Path(), k.Flag))
		}
		if paths[k.Path()] {
			errs = append(errs, fmt.Errorf("key %s twice", k.Path()))
		}
		byFlag[k.Flag], paths[k.Path()] = true, true
	}
	skip := map[string]bool{}
	for _, e := range except {
		skip[e] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !byFlag[f.Name] && !skip[f.Name] {
			errs = append(errs, fmt.Errorf("flag -%s: no key", f.Name))
		}
	})
	return errors.Join(errs...)
}

// ParseBytes parses a byte size: a whole number of bytes, or one followed
// by a unit: KiB, MiB, GiB, TiB (and K, M, G, T, the same powers of two),
// KB, MB, GB, TB (powers of ten) or B.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}}
	num, mult := s, int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return v * mult, nil
}

// diagError is the diagnostics' errors, one a line, each "file:line,col:
// summary; detail".
func diagError(diags hcl.Diagnostics) error {
	return errors.New(diagText(diags))
}

func diagText(diags hcl.Diagnostics) string {
	var lines []string
	for _, d := range diags.Errs() {
		lines = append(lines, d.Error())
	}
	return strings.Join(lines, "\n")
}
