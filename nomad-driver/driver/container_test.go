package driver

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/render"
)

// TestBuildContainerSpec: the container runs the rendered argv and env (the
// task's env without PATH), mounts the task and allocation directories at
// their host paths, gets the reserved GPUs as CDI devices, and joins the
// allocation's network namespace in bridge mode.
func TestBuildContainerSpec(t *testing.T) {
	cfg := &drivers.TaskConfig{
		ID: "t1", Name: "engine", AllocID: "a1", AllocDir: "/var/nomad/alloc/a1",
		Env:       map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-aa,GPU-bb", "PATH": "/usr/bin", "NOMAD_TASK_NAME": "engine"},
		Resources: &drivers.Resources{LinuxResources: &drivers.LinuxResources{MemoryLimitBytes: 1 << 30, CPUShares: 500}},
	}
	plan := &render.Plan{
		Config: config.TaskConfig{Engine: config.EngineVLLM, Image: "vllm/vllm-openai:v0.11.0"},
		Argv:   []string{"vllm", "serve", "m", "--port", "8000"},
		Env:    map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"},
	}
	s := buildContainerSpec(cfg, plan)
	must.Eq(t, "oasis-engine-a1", s.Name)
	must.Eq(t, "vllm/vllm-openai:v0.11.0", s.Image)
	must.Eq(t, []string{"vllm"}, s.Entrypoint)
	must.Eq(t, []string{"serve", "m", "--port", "8000"}, s.Command)
	must.Eq(t, map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-aa,GPU-bb", "NOMAD_TASK_NAME": "engine",
		"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, s.Env)
	must.Eq(t, []device{{Path: "nvidia.com/gpu=GPU-aa"}, {Path: "nvidia.com/gpu=GPU-bb"}}, s.Devices)
	must.Eq(t, namespace{NSMode: "host"}, s.NetNS)
	td := cfg.TaskDir()
	must.Eq(t, []mount{
		{Destination: td.SharedAllocDir, Source: td.SharedAllocDir, Type: "bind", Options: []string{"rbind", "rw"}},
		{Destination: td.Dir, Source: td.Dir, Type: "bind", Options: []string{"rbind", "rw"}},
	}, s.Mounts)
	must.EqOp(t, int64(1<<30), s.Resources.Memory.Limit)
	must.EqOp(t, uint64(500), s.Resources.CPU.Shares)

	cfg.NetworkIsolation = &drivers.NetworkIsolationSpec{Mode: drivers.NetIsolationModeGroup, Path: "/var/run/netns/a1"}
	must.Eq(t, namespace{NSMode: "path", Value: "/var/run/netns/a1"}, buildContainerSpec(cfg, plan).NetNS)
}

// TestDemux splits the runtime's multiplexed log stream by stream id.
func TestDemux(t *testing.T) {
	var in bytes.Buffer
	frame := func(stream byte, s string) {
		h := [8]byte{stream}
		binary.BigEndian.PutUint32(h[4:], uint32(len(s)))
		in.Write(h[:])
		in.WriteString(s)
	}
	frame(1, "out 1\n")
	frame(2, "err 1\n")
	frame(1, "out 2\n")
	var out, errOut bytes.Buffer
	must.NoError(t, demux(&in, &out, &errOut))
	must.EqOp(t, "out 1\nout 2\n", out.String())
	must.EqOp(t, "err 1\n", errOut.String())
}

// TestEngineEntrypoint: the image's entrypoint runs the engine where it is
// the same program, wherever the image keeps it.
func TestEngineEntrypoint(t *testing.T) {
	must.Eq(t, []string{"/app/llama-server"}, engineEntrypoint([]string{"llama-server"}, []string{"/app/llama-server"}))
	must.Eq(t, []string{"vllm"}, engineEntrypoint([]string{"vllm"}, []string{"vllm", "serve"}))
	must.Eq(t, []string{"python3"}, engineEntrypoint([]string{"python3"}, []string{"/bin/sh", "-c"}))
	must.Eq(t, []string{"oasis-sim"}, engineEntrypoint([]string{"oasis-sim"}, nil))
}
