package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/agentconfig"
	"github.com/oasis-llm/oasis/kvcached/app"
)

const example = "../../kvcached/app/testdata/kvcached.hcl"

// Every flag but --config has a key in the config file, and no key names a
// flag that does not exist.
func TestConfigKeysCoverFlags(t *testing.T) {
	var cfg app.Config
	fs := flag.NewFlagSet("oasis-kvcached", flag.ContinueOnError)
	fs.String("log-level", "info", "")
	defineFlags(fs, &cfg)
	must.NoError(t, agentconfig.Check(fs, app.ConfigKeys))
}

func TestParseFlagsWithConfig(t *testing.T) {
	t.Setenv("CONSUL_HTTP_ADDR", "")
	t.Setenv("OASIS_KVCACHED_PASSWORD", "")
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
  resp = "127.0.0.1:16380"
  quic = "127.0.0.1:17379"
}
tls {
  ca   = "/s/ca.pem"
  cert = "/s/cert.pem"
  key  = "/s/key.pem"
}
tiers {
  ram { bytes = "256MiB" }
  disk {
    bytes = "2GiB"
    dir   = "/var/lib/kv"
  }
}
peers {
  static      = ["10.0.0.1:7379", "10.0.0.2:7379"]
  consul_addr = "127.0.0.1:18500"
  datacenters = ["dc2"]
  wan_bytes_per_second = 0
}
limits { idle_timeout = "0s" }
`)
	write("d/b.json", `{"tiers": {"ram": {"bytes": "512MiB"}}, "limits": {"max_value_bytes": 1048576}}`)
	write("d/a.hcl", "tiers {\n  ram { bytes = \"128MiB\" }\n}\nauth { timeout = \"3s\" }\n")
	unknown := write("unknown.hcl", "tiers {\n  ram {\n    bytes = \"1GiB\"\n    size  = 3\n  }\n}\n")
	badSize := write("badsize.hcl", "tiers {\n  ram {\n    bytes = \"lots\"\n  }\n}\n")
	badDur := write("baddur.json", "{\"peers\": {\n\"timeout\": \"2 seconds\"}}")
	invalid := write("invalid.hcl", "tiers {\n  disk { bytes = \"1GiB\" }\n}\n") // disk without dir: the app's validation

	cases := []struct {
		name    string
		args    []string
		check   func(t *testing.T, c app.Config, logLevel string)
		wantErr []string
	}{
		{name: "the example is the defaults", args: []string{"--config", example}, check: func(t *testing.T, c app.Config, logLevel string) {
			def, defLevel, err := parseFlags(nil, io.Discard)
			must.NoError(t, err)
			must.Eq(t, def, c)
			must.Eq(t, defLevel, logLevel)
		}},
		{name: "full file", args: []string{"--config", full}, check: func(t *testing.T, c app.Config, logLevel string) {
			must.Eq(t, "debug", logLevel)
			must.Eq(t, "127.0.0.1:16380", c.Addr)
			must.Eq(t, "127.0.0.1:17379", c.QUICAddr)
			must.Eq(t, "/s/cert.pem", c.TLSCert)
			must.Eq(t, int64(256<<20), c.RAMBytes)
			must.Eq(t, int64(2<<30), c.DiskBytes)
			must.Eq(t, "/var/lib/kv", c.DataDir)
			must.Eq(t, []string{"10.0.0.1:7379", "10.0.0.2:7379"}, c.Peers)
			must.Eq(t, []string{"dc2"}, c.PeerDatacenters)
			must.Eq(t, "127.0.0.1:18500", c.ConsulAddr)
			must.Eq(t, int64(0), c.PeerWANBytesPerSecond)
			must.Eq(t, time.Duration(0), c.IdleTimeout)
		}},
		{name: "flags override the file", args: []string{"--ram-bytes", "64MiB", "--config", full, "-log-level=warn"},
			check: func(t *testing.T, c app.Config, logLevel string) {
				must.Eq(t, int64(64<<20), c.RAMBytes)
				must.Eq(t, "warn", logLevel)
				must.Eq(t, int64(2<<30), c.DiskBytes) // from the file
			}},
		{name: "directory in lexical order", args: []string{"--config", filepath.Join(dir, "d")},
			check: func(t *testing.T, c app.Config, _ string) {
				must.Eq(t, int64(512<<20), c.RAMBytes) // b.json after a.hcl
				must.Eq(t, int64(1<<20), c.MaxValueBytes)
				must.Eq(t, 3*time.Second, c.AuthTimeout)
			}},
		{name: "unknown key", args: []string{"--config", unknown}, wantErr: []string{"unknown.hcl:4,", `"size"`, "tiers.ram"}},
		{name: "bad size", args: []string{"--config", badSize}, wantErr: []string{"badsize.hcl:3,", "tiers.ram.bytes", "byte size"}},
		{name: "bad duration", args: []string{"--config", badDur}, wantErr: []string{"baddur.json:2,", "peers.timeout", "duration"}},
		{name: "the app's validation still applies", args: []string{"--config", invalid}, wantErr: []string{"--data-dir"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, logLevel, err := parseFlags(tc.args, io.Discard)
			if len(tc.wantErr) > 0 {
				must.Error(t, err)
				for _, w := range tc.wantErr {
					must.True(t, strings.Contains(err.Error(), w), must.Sprintf("%q in %v", w, err))
				}
				return
			}
			must.NoError(t, err)
			tc.check(t, c, logLevel)
		})
	}
}
