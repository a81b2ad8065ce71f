package server

import (
	"bytes"
	"context"
	"net"
	"testing"

	"github.com/oasis-llm/oasis/kvcached/resp"
	"github.com/oasis-llm/oasis/kvcached/store"
	"github.com/prometheus/client_golang/prometheus"
)

// countingWriter counts the reply bytes written to it.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// FuzzDispatch runs arbitrary commands through the command table, on one
// connection of a server over a small RAM-only store: the input's first
// byte picks whether a password is set (so AUTH, HELLO and NOAUTH are
// reached), then lines are commands and spaces separate their arguments.
// No command may panic, the store must stay within its limit, and no reply
// may be larger than what the input and the store could account for (a
// reply that grows with anything else is memory a client can make the
// server spend at will).
func FuzzDispatch(f *testing.F) {
	for _, s := range []string{
		"\x00SET k v\nGET k\nDEL k\nGET k",
		"\x00SET k v EX 10 NX GET\nTTL k\nPTTL k\nPERSIST k\nEXPIRE k -1\nEXISTS k k k",
		"\x00SET k v PX 9223372036854775807\nPEXPIRE k 9223372036854775807\nSET k v EXAT -1\nSET k v PXAT 0 KEEPTTL",
		"\x00MSET a 1 b 2 c 3\nMGET a b c d\nKEYS *\nSCAN 0 MATCH * COUNT 1000000000 TYPE string\nDBSIZE",
		"\x00SCAN 18446744073709551615 COUNT -1\nSCAN x\nKEYS [a-\nKEYS \\\nTYPE a\nUNLINK a b",
		"\x00HELLO 3\nGET nope\nHELLO 2 SETNAME x\nCLIENT GETNAME\nCLIENT ID\nCLIENT INFO\nCLIENT SETINFO lib-name x",
		"\x00INFO\nINFO all\nINFO keyspace\nCONFIG GET *\nCONFIG GET maxmemory\nCONFIG SET a b\nCOMMAND\nCOMMAND DOCS\nCOMMAND COUNT",
		"\x00SELECT 0\nSELECT 1\nECHO x\nPING\nPING x\nFLUSHALL\nFLUSHDB ASYNC\nRESET\nQUIT\nGET k",
		"\x01GET k\nAUTH wrong\nHELLO 3 AUTH default wrong\nAUTH default s3cret\nSET k v",
		"\x01HELLO 3 AUTH default s3cret SETNAME n\nRESET\nGET k\nAUTH s3cret\nMSET a b",
		"\x00NOSUCHCOMMAND a b\nGETXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX\nset K V\ngEt K\nSET\nMSET a",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 1<<16 {
			return
		}
		const ramLimit = 1 << 20
		st, err := store.Open(store.Config{RAMBytes: ramLimit, MaxValue: 64 << 10, Metrics: store.NewMetrics(prometheus.NewRegistry())})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		cfg := Config{Store: st, AuthFailureDelay: -1}
		if data[0]&1 == 1 {
			cfg.Password = "s3cret"
		}
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nc, peer := net.Pipe()
		defer nc.Close()
		defer peer.Close()
		out := &countingWriter{}
		c := &conn{id: 1, nc: nc, w: resp.NewWriter(out, preAuthWriteBuffer), authed: cfg.Password == ""}
		ctx := context.Background()
		for _, line := range bytes.Split(data[1:], []byte("\n")) {
			var args [][]byte
			for _, a := range bytes.Split(line, []byte(" ")) {
				if len(a) > 0 {
					args = append(args, bytes.Clone(a)) // each argument its own, as the reader gives them
				}
			}
			if len(args) == 0 {
				continue
			}
			before := out.n
			srv.dispatch(ctx, c, args)
			if err := c.w.Flush(); err != nil {
				t.Fatal(err)
			}
			// A reply holds at most every stored value once per argument
			// (MGET of one key many times), every key (KEYS, SCAN), and
			// a few KiB of fixed text (INFO, COMMAND).
			if limit := int64(16<<10 + (len(args)+1)*(len(data)+64) + 16*len(data)); out.n-before > limit {
				t.Fatalf("%q: %d-byte reply, over %d", line, out.n-before, limit)
			}
			if s := st.Stats(); s.RAMBytes > s.RAMLimit {
				t.Fatalf("%q: RAM tier holds %d bytes, over its %d", line, s.RAMBytes, s.RAMLimit)
			}
			if c.quit {
				break
			}
		}
		if c.authed && cfg.Password != "" && !bytes.Contains(data, []byte("s3cret")) {
			t.Fatalf("authenticated without the password")
		}
	})
}
