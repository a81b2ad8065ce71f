package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/shoenig/test/must"
)

// binary is oasis-sim, built once for the package's tests.
var binary string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithCommand(m, "github.com/oasis-llm/oasis/cmd/oasis-sim", &binary))
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
	kvPort := testutil.FreePort(t)
	sim := testutil.StartSim(t, testutil.SimConfig{Bin: binary, Model: "meta-llama/Llama-3.1-8B-Instruct", Args: []string{
		"--host", "127.0.0.1",
		"--served-model-name", "meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "1", "--block-size", "16",
		"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`,
		"--kv-events-config", fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:%d","topic":"kv-events"}`, kvPort),
		"--speed", "0"}})
	base := "http://" + sim.Addr
	must.StrContains(t, sim.Output(), "--tensor-parallel-size 1")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", kvPort), Topic: "kv-events"})
	must.NoError(t, err)
	defer sub.Close()
	go sub.Run(ctx)
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
	must.NoError(t, sim.Stop())
}
