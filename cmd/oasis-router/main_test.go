package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/agentconfig"
	"github.com/oasis-llm/oasis/router/app"
)

const example = "../../router/app/testdata/router.hcl"

// Every flag but -config has a key in the config file, and no key names a
// flag that does not exist.
func TestConfigKeysCoverFlags(t *testing.T) {
	var c app.Config
	var rt runtimeFlags
	var lists listFlags
	must.NoError(t, agentconfig.Check(newFlagSet(&c, &rt, &lists), app.ConfigKeys))
}

// The example file lists every key, each at its flag's default: loading it
// changes nothing, so it documents the defaults truthfully.
func TestExampleIsDefaults(t *testing.T) {
	src, err := os.ReadFile(example)
	must.NoError(t, err)
	settings, err := agentconfig.Parse(app.ConfigKeys, example, src)
	must.NoError(t, err)
	seen := map[string]bool{}
	for _, s := range settings {
		seen[s.Key.Path()] = true
	}
	for _, k := range app.ConfigKeys {
		must.True(t, seen[k.Path()], must.Sprintf("%s missing from %s", k.Path(), example))
	}
	def, defRT, err := parseFlags(nil)
	must.NoError(t, err)
	got, gotRT, err := parseFlags([]string{"-config", example})
	must.NoError(t, err)
	must.Eq(t, def, got)
	must.Eq(t, defRT, gotRT)
}

// Every key is in router/README.md's reference table.
func TestReadmeTable(t *testing.T) {
	b, err := os.ReadFile("../../router/README.md")
	must.NoError(t, err)
	for _, k := range app.ConfigKeys {
		must.StrContains(t, string(b), "`"+k.Name+"` | `-"+k.Flag+"`", must.Sprintf("row of %s", k.Path()))
	}
}

func TestParseFlagsWithConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		must.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		must.NoError(t, os.WriteFile(p, []byte(src), 0o600))
		return p
	}
	full := write("full.hcl", `
log_level = "debug"
listeners {
  api      = "0.0.0.0:18080"
  register = true
}
tls {
  cert = "/s/cert.pem"
  key  = "/s/key.pem"
}
discovery {
  source  = "static"
  engines = ["m=127.0.0.1:9001@sim", "m=127.0.0.1:9002"]
  hosted_upstreams = ["https://api.example.com/v1"]
}
policy { kv_prefix = "x/router" }
limits {
  max_body_bytes    = "8MiB"
  body_read_timeout = "5s"
  eject_after       = 0
}
telemetry {
  tracing {
    otlp_endpoint = "http://127.0.0.1:4318"
    sample_ratio  = 1
  }
}
runtime { memory_limit = "1GiB" }
`)
	write("d/20-b.json", `{"limits": {"max_connections": 20}, "log_level": "warn"}`)
	write("d/10-a.hcl", "limits {\n  max_connections = 10\n  eject_for = \"3s\"\n}\n")
	write("d/30-c.hcl", "limits { max_connections = 30 }\n")
	unknown := write("unknown.hcl", "limits {\n  max_body_bytes = \"1MiB\"\n  max_bodies = 3\n}\n")
	badDur := write("baddur.json", "{\n  \"limits\": {\n    \"eject_for\": \"soon\"\n  }\n}\n")
	badSize := write("badsize.hcl", "runtime {\n  memory_limit = \"lots\"\n}\n")
	badEngines := write("badengines.hcl", "discovery {\n  engines = [\"nohost\"]\n}\n")

	cases := []struct {
		name    string
		args    []string
		check   func(t *testing.T, c app.Config, rt runtimeFlags)
		wantErr []string
	}{
		{name: "no file: production defaults", check: func(t *testing.T, c app.Config, rt runtimeFlags) {
			must.Eq(t, app.DefaultTraceSampleRatio, c.TraceSampleRatio)
			must.Eq(t, 0.05, c.TraceSampleRatio)
			must.Eq(t, 3, c.EjectAfter)
			must.Eq(t, app.DefaultListen, c.Listen)
		}},
		{name: "eject-after 0 stays 0 (never)", args: []string{"-eject-after", "0"}, check: func(t *testing.T, c app.Config, _ runtimeFlags) {
			must.Eq(t, 0, c.EjectAfter)
		}},
		{name: "full file", args: []string{"-config", full}, check: func(t *testing.T, c app.Config, rt runtimeFlags) {
			must.Eq(t, "debug", rt.logLevel)
			must.Eq(t, "0.0.0.0:18080", c.Listen)
			must.True(t, c.Register)
			must.Eq(t, "/s/cert.pem", c.TLSCert)
			must.Eq(t, "/s/key.pem", c.TLSKey)
			must.Eq(t, app.DiscoveryStatic, c.Discovery)
			must.Eq(t, []app.StaticEngine{{Model: "m", Address: "127.0.0.1:9001", Engine: "sim"}, {Model: "m", Address: "127.0.0.1:9002"}}, c.Engines)
			must.Eq(t, []string{"https://api.example.com/v1"}, c.HostedUpstreams)
			must.Eq(t, "x/router", c.KVPrefix)
			must.Eq(t, int64(8<<20), c.MaxBodyBytes)
			must.Eq(t, 5*time.Second, c.BodyReadTimeout)
			must.Eq(t, 0, c.EjectAfter)
			must.Eq(t, "http://127.0.0.1:4318", c.OTLPEndpoint)
			must.Eq(t, 1.0, c.TraceSampleRatio)
			must.Eq(t, int64(1<<30), rt.memoryLimit)
		}},
		{name: "flags override the file", args: []string{"-listen", "127.0.0.1:18081", "-config", full, "-trace-sample-ratio=0.2", "-eject-after=4"},
			check: func(t *testing.T, c app.Config, rt runtimeFlags) {
				must.Eq(t, "127.0.0.1:18081", c.Listen)
				must.Eq(t, 0.2, c.TraceSampleRatio)
				must.Eq(t, 4, c.EjectAfter)
				must.Eq(t, "debug", rt.logLevel) // from the file
			}},
		{name: "directory in lexical order, then a file", args: []string{"-config", filepath.Join(dir, "d"), "-config", full},
			check: func(t *testing.T, c app.Config, rt runtimeFlags) {
				must.Eq(t, 30, c.MaxConnections)         // 30-c.hcl last in d/
				must.Eq(t, 3*time.Second, c.EjectFor)    // only in 10-a.hcl
				must.Eq(t, "debug", rt.logLevel)         // full.hcl after the directory
				must.Eq(t, int64(8<<20), c.MaxBodyBytes) // full.hcl
			}},
		{name: "unknown key", args: []string{"-config", unknown}, wantErr: []string{"unknown.hcl:3,", `"max_bodies"`}},
		{name: "bad duration", args: []string{"-config", badDur}, wantErr: []string{"baddur.json:3,", "limits.eject_for", "duration"}},
		{name: "bad size", args: []string{"-config", badSize}, wantErr: []string{"badsize.hcl:2,", "runtime.memory_limit", "byte size"}},
		{name: "value the flag's parser refuses", args: []string{"-config", badEngines}, wantErr: []string{"-engines"}},
		{name: "missing file", args: []string{"-config", filepath.Join(dir, "none.hcl")}, wantErr: []string{"-config", "none.hcl"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, rt, err := parseFlags(tc.args)
			if len(tc.wantErr) > 0 {
				must.Error(t, err)
				for _, w := range tc.wantErr {
					must.True(t, strings.Contains(err.Error(), w), must.Sprintf("%q in %v", w, err))
				}
				return
			}
			must.NoError(t, err)
			tc.check(t, c, rt)
		})
	}
}

// CORS is off by default; its flags are comma-separated lists.
func TestCORSFlags(t *testing.T) {
	def, _, err := parseFlags(nil)
	must.NoError(t, err)
	must.Nil(t, def.CORSOrigins)
	c, _, err := parseFlags([]string{"-cors-origins", "https://a.example, https://b.example", "-cors-headers", "*"})
	must.NoError(t, err)
	must.Eq(t, []string{"https://a.example", "https://b.example"}, c.CORSOrigins)
	must.Eq(t, []string{"*"}, c.CORSHeaders)
}
