package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/gobuild"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/shoenig/test/must"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "oasis-sim-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "oasis-sim")
	if err := gobuild.Commands(context.Background(), dir, "github.com/oasis-llm/oasis/cmd/oasis-sim"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestVersion(t *testing.T) {
	out, err := exec.Command(binary, "--version").Output()
	must.NoError(t, err)
	must.RegexMatch(t, regexp.MustCompile(`^oasis-sim \d+\.\d+\.\d+\n$`), string(out))
}

func TestMalformedFlagExits(t *testing.T) {
	cmd := exec.Command(binary, "serve", "m", "--kv-events-config", "{bad")
	out, err := cmd.CombinedOutput()
	must.Error(t, err)
	must.Eq(t, 2, cmd.ProcessState.ExitCode())
	must.StrContains(t, string(out), "--kv-events-config")
}

// The binary started with the argv the Nomad driver renders serves, publishes KV
// events, and exits cleanly on SIGTERM.
func TestServeAsDriverRendersIt(t *testing.T) {
	port, kvPort := freePort(t), freePort(t)
	cmd := exec.Command(binary, "serve", "meta-llama/Llama-3.1-8B-Instruct",
		"--host", "127.0.0.1", "--port", fmt.Sprint(port),
		"--served-model-name", "meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "1", "--block-size", "16",
		"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`,
		"--kv-events-config", fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:%d","topic":"kv-events"}`, kvPort),
		"--speed", "0")
	var logs strings.Builder
	cmd.Stderr = &logs
	must.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		must.True(t, time.Now().Before(deadline), must.Sprintf("not healthy; logs:\n%s", logs.String()))
		time.Sleep(50 * time.Millisecond)
	}
	must.StrContains(t, logs.String(), "--tensor-parallel-size 1")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := kvevents.NewSubscriber(ctx, kvevents.SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", kvPort), Topic: "kv-events"})
	must.NoError(t, err)
	defer sub.Close()
	got := make(chan kvevents.Message, 8)
	go func() {
		for {
			m, err := sub.Next(ctx)
			if err != nil {
				return
			}
			got <- m
		}
	}()
	for i := 0; ; i++ {
		body := fmt.Sprintf(`{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"%d%s","max_tokens":2}`, i, strings.Repeat(" lorem ipsum", 20))
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		must.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		must.Eq(t, 200, resp.StatusCode)
		select {
		case m := <-got:
			_, ok := m.Batch.Events[0].(kvevents.BlockStored)
			must.True(t, ok)
			goto stop
		case <-time.After(100 * time.Millisecond):
		}
		must.NoError(t, ctx.Err())
	}
stop:
	must.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		must.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("oasis-sim did not exit on SIGTERM")
	}
}
