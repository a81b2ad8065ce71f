package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/kvcached/peer"
)

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:6380": true, "[::1]:6380": true, "0.0.0.0:6380": false, "10.0.0.5:6380": false, "[::]:6380": false} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		must.NoError(t, err)
		must.Eq(t, want, isLoopback(a), must.Sprint(addr))
	}
}

// TestRunServesUntilItsContextEnds runs an App in process: it answers the
// Redis protocol and /health, and Run returns nil once its context ends.
func TestRunServesUntilItsContextEnds(t *testing.T) {
	a, err := New(Config{Addr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RAMBytes: 64 << 20, Password: "pw"})
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()

	c := redis.NewClient(&redis.Options{Addr: a.Addr().String(), Password: "pw", MaxRetries: -1})
	defer c.Close()
	must.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	must.Eq(t, "v", c.Get(ctx, "k").Val())
	resp, err := http.Get("http://" + a.HTTPAddr().String() + "/health")
	must.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.StrContains(t, string(body), `"ram_blocks":1`)

	cancel()
	must.NoError(t, <-done)
	must.NoError(t, a.Close(), must.Sprint("Close after Run"))
}

// TestNewNamesTheFlag: configuration errors are *ConfigError naming the
// flag, and New leaves nothing open behind them.
func TestNewNamesTheFlag(t *testing.T) {
	for flag, cfg := range map[string]Config{
		"--disk-bytes":       {DiskBytes: 1 << 20},
		"--ram-bytes":        {RAMBytes: 16},
		"--mesh":             {Mesh: true, QUICAddr: "127.0.0.1:0"},
		"--peer-datacenters": {PeerDatacenters: []string{"dc2"}},
		"--password-file":    {Addr: "127.0.0.1:0", PasswordFile: "/nonexistent/password"},
		"--addr":             {Addr: "256.0.0.1:1"},
	} {
		_, err := New(cfg)
		var ce *ConfigError
		must.True(t, errors.As(err, &ce), must.Sprintf("%s: %v", flag, err))
		must.Eq(t, flag, ce.Flag)
	}
}

// TestPeersServeEachOther runs two Apps in process as each other's static
// peers over QUIC with mutual TLS: a block stored on one is read from the
// other, and closing both leaves no goroutine behind (TestMain).
func TestPeersServeEachOther(t *testing.T) {
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "oasis test CA")
	caFile, certA, keyA := ca.WriteFiles(t, dir, "a", peer.DefaultServerName)
	_, certB, keyB := ca.WriteFiles(t, dir, "b", peer.DefaultServerName)
	qa, qb := testutil.FreeAddr(t), testutil.FreeAddr(t)
	peerApp := func(quic, cert, key, other string) *App {
		a, err := New(Config{Addr: "127.0.0.1:0", RAMBytes: 64 << 20, QUICAddr: quic, TLSCA: caFile, TLSCert: cert, TLSKey: key,
			Peers: []string{other}, PeerFilterInterval: 100 * time.Millisecond, PeerTimeout: time.Second})
		must.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() { cancel(); must.NoError(t, <-done) })
		return a
	}
	a, b := peerApp(qa, certA, keyA, qb), peerApp(qb, certB, keyB, qa)
	ca1 := redis.NewClient(&redis.Options{Addr: a.Addr().String(), MaxRetries: -1})
	cb := redis.NewClient(&redis.Options{Addr: b.Addr().String(), MaxRetries: -1})
	t.Cleanup(func() { ca1.Close(); cb.Close() })

	ctx := context.Background()
	must.NoError(t, ca1.Set(ctx, "m@1@0@1@bfloat16kv_bytes", "from a", 0).Err())
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "b to fetch a's block", func() bool {
		return cb.Get(ctx, "m@1@0@1@bfloat16kv_bytes").Val() == "from a"
	})
}
