package agentconfig

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

var testKeys = []Key{
	{"", "log_level", "log-level", String},
	{"listeners", "api", "listen", String},
	{"limits", "max_body_bytes", "max-body-bytes", Bytes},
	{"limits", "body_read_timeout", "body-read-timeout", Duration},
	{"limits", "max_connections", "max-connections", Int},
	{"telemetry.tracing", "sample_ratio", "trace-sample-ratio", Float},
	{"telemetry.tracing", "enabled", "tracing", Bool},
	{"discovery", "hosted_upstreams", "hosted-upstreams", List},
}

type testFlags struct {
	logLevel, listen, hosted string
	maxBody                  int64
	timeout                  time.Duration
	maxConns                 int
	ratio                    float64
	tracing                  bool
}

func newFlags() (*flag.FlagSet, *testFlags) {
	var f testFlags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.StringVar(&f.logLevel, "log-level", "info", "")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:1", "")
	fs.Int64Var(&f.maxBody, "max-body-bytes", 16, "")
	fs.DurationVar(&f.timeout, "body-read-timeout", time.Second, "")
	fs.IntVar(&f.maxConns, "max-connections", 10, "")
	fs.Float64Var(&f.ratio, "trace-sample-ratio", 0.05, "")
	fs.BoolVar(&f.tracing, "tracing", false, "")
	fs.StringVar(&f.hosted, "hosted-upstreams", "", "")
	return fs, &f
}

func TestParse(t *testing.T) {
	cases := []struct {
		name, file, src string
		want            map[string]string // flag → value
		wantErr         []string          // substrings of the error
	}{
		{name: "hcl, every kind", file: "a.hcl", src: `
log_level = "debug"
listeners {
  api = "0.0.0.0:9000"
}
limits {
  max_body_bytes    = "8MiB"
  body_read_timeout = "1m30s"
  max_connections   = 100
}
telemetry {
  tracing {
    sample_ratio = 0.1
    enabled      = true
  }
}
discovery {
  hosted_upstreams = ["https://a.example.com", "https://*.b.example.com/v1"]
}
`, want: map[string]string{"log-level": "debug", "listen": "0.0.0.0:9000", "max-body-bytes": "8388608",
			"body-read-timeout": "1m30s", "max-connections": "100", "trace-sample-ratio": "0.1", "tracing": "true",
			"hosted-upstreams": "https://a.example.com,https://*.b.example.com/v1"}},
		{name: "json", file: "a.json", src: `{"limits": {"max_body_bytes": 1024, "body_read_timeout": "5s"}, "telemetry": {"tracing": {"sample_ratio": 1}}}`,
			want: map[string]string{"max-body-bytes": "1024", "body-read-timeout": "5s", "trace-sample-ratio": "1"}},
		{name: "empty file", file: "a.hcl", src: "", want: map[string]string{}},
		{name: "unknown key", file: "x.hcl", src: "limits {\n  max_bodies = 3\n}\n",
			wantErr: []string{"x.hcl:2,", `"max_bodies"`}},
		{name: "unknown block", file: "x.hcl", src: "\n\nlimitz {\n}\n", wantErr: []string{"x.hcl:3,", `"limitz"`}},
		{name: "unknown key in json", file: "x.json", src: "{\n \"limits\": {\n  \"nope\": 1\n }\n}",
			wantErr: []string{"x.json:3,", `"nope"`}},
		{name: "bad duration", file: "x.hcl", src: "limits {\n  body_read_timeout = \"ten seconds\"\n}\n",
			wantErr: []string{"x.hcl:2,", "limits.body_read_timeout", "duration"}},
		{name: "duration as number", file: "x.hcl", src: "limits {\n  body_read_timeout = 10\n}\n",
			wantErr: []string{"x.hcl:2,", "limits.body_read_timeout", "got number"}},
		{name: "bad size", file: "x.hcl", src: "limits {\n\n  max_body_bytes = \"8 parsecs\"\n}\n",
			wantErr: []string{"x.hcl:3,", "limits.max_body_bytes", "byte size"}},
		{name: "negative size", file: "x.hcl", src: "limits { max_body_bytes = -1 }", wantErr: []string{"x.hcl:1,", "limits.max_body_bytes"}},
		{name: "fractional int", file: "x.hcl", src: "limits { max_connections = 1.5 }", wantErr: []string{"x.hcl:1,", "limits.max_connections", "not whole"}},
		{name: "string for bool", file: "x.hcl", src: "telemetry {\n tracing { enabled = \"yes\" }\n}", wantErr: []string{"x.hcl:2,", "telemetry.tracing.enabled"}},
		{name: "null", file: "x.hcl", src: "log_level = null", wantErr: []string{"x.hcl:1,", "log_level", "null"}},
		{name: "variable", file: "x.hcl", src: "log_level = var.x", wantErr: []string{"x.hcl:1,", "log_level"}},
		{name: "duplicate block", file: "x.hcl", src: "limits {}\nlimits {}\n", wantErr: []string{"x.hcl:2,", "Duplicate block"}},
		{name: "duplicate key", file: "x.hcl", src: "log_level = \"a\"\nlog_level = \"b\"\n", wantErr: []string{"x.hcl:2,"}},
		{name: "key given as block", file: "x.hcl", src: "log_level {}\n", wantErr: []string{"x.hcl:1,", "log_level"}},
		{name: "syntax error", file: "x.hcl", src: "limits {\n  = 3\n", wantErr: []string{"x.hcl:2,"}},
		{name: "list item not a string", file: "x.hcl", src: "discovery { hosted_upstreams = [1] }", wantErr: []string{"x.hcl:1,", "discovery.hosted_upstreams"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(testKeys, tc.file, []byte(tc.src))
			if len(tc.wantErr) > 0 {
				must.Error(t, err)
				for _, w := range tc.wantErr {
					must.StrContains(t, err.Error(), w)
				}
				return
			}
			must.NoError(t, err)
			m := map[string]string{}
			for _, s := range got {
				m[s.Key.Flag] = s.Value
			}
			must.Eq(t, tc.want, m)
		})
	}
}

func write(t *testing.T, dir, name, src string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	must.NoError(t, os.WriteFile(p, []byte(src), 0o600))
	return p
}

func TestApplyOrderAndFlagsWin(t *testing.T) {
	dir := t.TempDir()
	// Lexical order: 10-base.hcl, 20-override.json, 30-last.hcl; others ignored.
	write(t, dir, "20-override.json", `{"listeners": {"api": "127.0.0.1:2"}, "limits": {"max_connections": 20}}`)
	write(t, dir, "10-base.hcl", "listeners { api = \"127.0.0.1:1\" }\nlog_level = \"warn\"\nlimits { max_connections = 10 }\n")
	write(t, dir, "30-last.hcl", "limits { max_connections = 30 }\n")
	write(t, dir, "README.md", "not config")
	write(t, dir, "40-ignored.hcl~", "garbage {")
	must.NoError(t, os.Mkdir(filepath.Join(dir, "sub.hcl"), 0o700)) // directories inside are not read
	extra := write(t, t.TempDir(), "extra.conf", "limits { body_read_timeout = \"7s\" }\n")

	files, err := Files([]string{dir, extra})
	must.NoError(t, err)
	must.Eq(t, []string{"10-base.hcl", "20-override.json", "30-last.hcl", "extra.conf"}, bases(files))

	cases := []struct {
		name  string
		args  []string
		check func(t *testing.T, f *testFlags)
	}{
		{"files only", nil, func(t *testing.T, f *testFlags) {
			must.Eq(t, "127.0.0.1:2", f.listen)
			must.Eq(t, 30, f.maxConns)
			must.Eq(t, "warn", f.logLevel)
			must.Eq(t, 7*time.Second, f.timeout)
			must.Eq(t, 16, f.maxBody) // the flag default: in no file
		}},
		{"flags win", []string{"-max-connections", "5", "-log-level=error"}, func(t *testing.T, f *testFlags) {
			must.Eq(t, 5, f.maxConns)
			must.Eq(t, "error", f.logLevel)
			must.Eq(t, "127.0.0.1:2", f.listen)
		}},
		{"a flag set to its default still wins", []string{"-max-connections=10"}, func(t *testing.T, f *testFlags) {
			must.Eq(t, 10, f.maxConns)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs, f := newFlags()
			must.NoError(t, fs.Parse(tc.args))
			must.NoError(t, Apply(fs, testKeys, []string{dir, extra}))
			tc.check(t, f)
		})
	}
}

func bases(files []string) []string {
	var out []string
	for _, f := range files {
		out = append(out, filepath.Base(f))
	}
	return out
}

func TestApplyErrors(t *testing.T) {
	dir := t.TempDir()
	bad := write(t, dir, "bad.hcl", "listeners {\n  api = \"x\"\n}\nlimits {\n  max_connections = 99999999999999999999\n}\n")
	fs, _ := newFlags()
	must.NoError(t, fs.Parse(nil))
	err := Apply(fs, testKeys, []string{bad})
	must.Error(t, err)
	must.StrContains(t, err.Error(), "bad.hcl:5,")
	must.StrContains(t, err.Error(), "limits.max_connections")

	// A value the key's kind accepts but the flag refuses: the flag's error, with file:line and key.
	fs, _ = newFlags()
	must.NoError(t, fs.Parse(nil))
	overflow := write(t, dir, "overflow.hcl", "\nlimits {\n  max_body_bytes = \"4TiB\"\n}\n")
	keys := append([]Key{}, testKeys...)
	keys = append(keys, Key{"limits", "n", "max-body-bytes-int", Int})
	var small int8flag
	fs.Var(&small, "max-body-bytes-int", "")
	must.NoError(t, Apply(fs, keys, []string{overflow}))
	bad2 := write(t, dir, "bad2.hcl", "limits {\n  n = 300\n}\n")
	err = Apply(fs, keys, []string{bad2})
	must.Error(t, err)
	must.StrContains(t, err.Error(), "bad2.hcl:2,")
	must.StrContains(t, err.Error(), "limits.n (flag -max-body-bytes-int)")

	must.ErrorContains(t, Apply(fs, keys, []string{filepath.Join(dir, "missing.hcl")}), "-config")
}

// int8flag refuses values past 127, as a flag's own validation might.
type int8flag int8

func (f *int8flag) String() string { return "0" }
func (f *int8flag) Set(s string) error {
	if len(s) > 2 {
		return os.ErrInvalid
	}
	return nil
}

func TestCheck(t *testing.T) {
	fs, _ := newFlags()
	must.NoError(t, Check(fs, testKeys))
	fs.Bool("config-only", false, "")
	err := Check(fs, append(testKeys, Key{"", "x", "missing", String}))
	must.Error(t, err)
	must.StrContains(t, err.Error(), "flag -config-only: no key")
	must.StrContains(t, err.Error(), "key x: no flag -missing")
	must.NoError(t, Check(fs, testKeys, "config-only"))
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "8GiB": 8 << 30, "8 GiB": 8 << 30, "1G": 1 << 30, "1GB": 1e9, "512MiB": 512 << 20, "10B": 10} {
		got, err := ParseBytes(in)
		must.NoError(t, err, must.Sprint(in))
		must.Eq(t, want, got, must.Sprint(in))
	}
	for _, in := range []string{"", "x", "-1", "1.5GiB", "GiB", "99999999TiB"} {
		_, err := ParseBytes(in)
		must.Error(t, err, must.Sprint(in))
	}
}

func FuzzParse(f *testing.F) {
	f.Add("a.hcl", "log_level = \"debug\"\nlimits {\n  max_body_bytes = \"8MiB\"\n  body_read_timeout = \"1s\"\n}\n")
	f.Add("a.json", `{"telemetry": {"tracing": {"sample_ratio": 0.5, "enabled": true}}, "discovery": {"hosted_upstreams": ["a"]}}`)
	f.Add("a.hcl", "telemetry { tracing { sample_ratio = 1e400 } }")
	f.Add("a.hcl", "limits { max_connections = 1 + 2 }")
	f.Fuzz(func(t *testing.T, name, src string) {
		settings, err := Parse(testKeys, name, []byte(src))
		if err != nil {
			if !strings.Contains(err.Error(), ":") {
				t.Fatalf("error without a position: %v", err)
			}
			return
		}
		fs, _ := newFlags()
		for _, s := range settings {
			// Every accepted value is one the flag takes, except ranges the kind does not bound.
			if err := fs.Set(s.Key.Flag, s.Value); err != nil && s.Key.Kind != Int && s.Key.Kind != Bytes && s.Key.Kind != Float {
				t.Fatalf("%s = %q accepted by Parse, refused by its flag: %v", s.Key.Path(), s.Value, err)
			}
		}
	})
}
