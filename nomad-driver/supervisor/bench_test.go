//go:build linux

package supervisor

import (
	"context"
	"testing"
	"time"
)

// BenchmarkLaunchKill is one engine's supervisor from Launch to Kill: the
// re-execution, the engine's start, the socket, and the teardown.
func BenchmarkLaunchKill(b *testing.B) {
	cfg := Config{SocketDir: b.TempDir()}
	cmd := Command{Path: "/bin/sleep", Args: []string{"1000"}, Env: []string{}}
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		h, err := Launch(ctx, cfg, cmd)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Kill(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExec is one Exec of /bin/true in a running engine's context.
func BenchmarkExec(b *testing.B) {
	cfg := Config{SocketDir: b.TempDir()}
	h, err := Launch(context.Background(), cfg, Command{Path: "/bin/sleep", Args: []string{"1000"}, Env: []string{"PATH=/bin"}})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Kill()
	for b.Loop() {
		if _, code, err := h.Exec(context.Background(), []string{"/bin/true"}); err != nil || code != 0 {
			b.Fatalf("Exec = %d, %v", code, err)
		}
	}
}

// BenchmarkStatsSample is one Stats RPC: a /proc walk of the engine's tree.
func BenchmarkStatsSample(b *testing.B) {
	cfg := Config{SocketDir: b.TempDir()}
	h, err := Launch(context.Background(), cfg, Command{Path: "/bin/sleep", Args: []string{"1000"}, Env: []string{}})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Kill()
	for b.Loop() {
		if _, err := h.sample(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
