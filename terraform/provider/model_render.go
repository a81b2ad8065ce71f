package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// Model roles: one group of whole engines, or a prefill and a decode group.
const (
	modelRoleBoth          = "both"
	modelRoleDisaggregated = "disaggregated"
)

// Job meta the provider writes on the jobs it registers.
const (
	// metaManagedBy names the provider as the job's owner.
	metaManagedBy = "oasis_managed_by"
	// metaHash holds specHash of what the provider submitted; Read compares
	// it to detect a job changed outside Terraform.
	metaHash      = "oasis_tf_hash"
	managedByThis = "terraform-provider-oasis"
)

// modelJobPrefix prefixes a model's served name to make its Nomad job id.
const modelJobPrefix = "oasis-model-"

// modelSpec is an oasis_model with every default applied: what the pure
// renderer turns into a Nomad job.
type modelSpec struct {
	Name                 string
	Region               string
	Namespace            string
	Datacenters          []string
	NodePool             string
	Engine               string
	Model                string
	Role                 string
	Count                int
	PrefillCount         int
	DecodeCount          int
	KVOffload            string
	KVOffloadSizeGB      float64
	KVOffloadTier        string
	TensorParallelSize   int
	MaxModelLen          int
	GPUMemoryUtilization float64
	BlockSize            int
	ExtraArgs            []string
	EngineBinary         string
	EngineImage          string
	CPU                  int
	MemoryMB             int
	// GPUs nil means "not set": one per tensor-parallel rank on GPU engines.
	GPUs *int
}

// modelJobID is the Nomad job id of the model served as name.
func modelJobID(name string) string { return modelJobPrefix + name }

// gpuCount is the number of GPUs each engine reserves.
func (s modelSpec) gpuCount() int {
	if s.GPUs != nil {
		return *s.GPUs
	}
	if config.IsGPUEngine(s.Engine) {
		return max(s.TensorParallelSize, 1)
	}
	return 0
}

// kvOffload is the kv_offload mode rendered: as set, else nixl for a
// disaggregated model (the KV transfer between prefill and decode) and none
// for whole engines.
func (s modelSpec) kvOffload() string {
	switch {
	case s.KVOffload != "":
		return s.KVOffload
	case s.Role == modelRoleDisaggregated:
		return config.OffloadNIXL
	}
	return config.OffloadNone
}

// renderModelJob renders the model as a Nomad service job shaped like the
// recipes (recipes/tiny/sim/agg, recipes/llama3-8b/*): service
// oasis-engine with the meta the router reads, an HTTP health check, the
// recipes' update and restart blocks and an llm driver task. It is pure:
// the same spec always renders the same job.
func renderModelJob(s modelSpec) *nomadapi.Job {
	id := modelJobID(s.Name)
	job := &nomadapi.Job{
		ID:          ptr(id),
		Name:        ptr(id),
		Type:        ptr(nomadapi.JobTypeService),
		Datacenters: s.Datacenters,
		Update: &nomadapi.UpdateStrategy{
			MaxParallel:      ptr(1),
			HealthCheck:      ptr("checks"),
			MinHealthyTime:   ptr[time.Duration](30 * time.Second),
			HealthyDeadline:  ptr[time.Duration](30 * time.Minute),
			ProgressDeadline: ptr[time.Duration](40 * time.Minute),
			AutoRevert:       ptr(true),
		},
	}
	if s.Region != "" {
		job.Region = ptr(s.Region)
	}
	if s.Namespace != "" {
		job.Namespace = ptr(s.Namespace)
	}
	if s.NodePool != "" {
		job.NodePool = ptr(s.NodePool)
	}
	if s.Role == modelRoleDisaggregated {
		job.TaskGroups = []*nomadapi.TaskGroup{
			renderGroup(s, config.RolePrefill, s.PrefillCount),
			renderGroup(s, config.RoleDecode, s.DecodeCount),
		}
	} else {
		job.TaskGroups = []*nomadapi.TaskGroup{renderGroup(s, config.RoleBoth, s.Count)}
	}
	return job
}

// groupName is the task group of an engine role: "engine" for whole
// engines, else the role.
func groupName(role string) string {
	if role == config.RoleBoth {
		return "engine"
	}
	return role
}

// renderGroup renders the group of one engine role.
func renderGroup(s modelSpec, role string, count int) *nomadapi.TaskGroup {
	ports := []string{"http"}
	events := config.SupportsKVEvents(s.Engine)
	if events {
		ports = append(ports, "kv_events", "kv_events_replay")
	}
	if usesNIXLPort(s.Engine, role) {
		ports = append(ports, "nixl")
	}
	if usesBootstrapPort(s.Engine, role) {
		ports = append(ports, "bootstrap")
	}
	net := &nomadapi.NetworkResource{}
	for _, p := range ports {
		net.DynamicPorts = append(net.DynamicPorts, nomadapi.Port{Label: p})
	}
	return &nomadapi.TaskGroup{
		Name:     ptr(groupName(role)),
		Count:    ptr(count),
		Networks: []*nomadapi.NetworkResource{net},
		Services: []*nomadapi.Service{renderService(s, role)},
		// The service leaves Consul (and the router) first; requests on
		// their way get shutdown_delay, then the driver drains (killTimeout).
		ShutdownDelay: ptr(shutdownDelay(s)),
		RestartPolicy: &nomadapi.RestartPolicy{
			Attempts: ptr(3),
			Interval: ptr[time.Duration](30 * time.Minute),
			Delay:    ptr[time.Duration](30 * time.Second),
			Mode:     ptr("fail"),
		},
		Tasks: []*nomadapi.Task{renderTask(s, role)},
	}
}

func usesNIXLPort(engine, role string) bool {
	return role != config.RoleBoth && (engine == config.EngineVLLM || engine == config.EngineSim)
}

// pdProtocol is the disaggregation protocol of an engine's prefill and
// decode instances (the router's oasis_pd_protocol meta): the sim renders
// vLLM's NixlConnector handshake here (nixl side channel port).
func pdProtocol(engine string) string {
	if engine == config.EngineSGLang {
		return "sglang"
	}
	return "vllm"
}

func usesBootstrapPort(engine, role string) bool {
	return engine == config.EngineSGLang && role == config.RolePrefill
}

// renderService is the oasis-engine registration the router discovers.
func renderService(s modelSpec, role string) *nomadapi.Service {
	meta := map[string]string{
		"oasis_model":        s.Name,
		"oasis_engine":       s.Engine,
		"oasis_role":         role,
		"oasis_metrics_path": metricsPath(s.Engine),
		"oasis_node":         "${node.unique.id}",
	}
	if config.SupportsKVEvents(s.Engine) {
		meta["oasis_kv_events"] = "tcp://${NOMAD_ADDR_kv_events}"
		meta["oasis_kv_events_replay"] = "tcp://${NOMAD_ADDR_kv_events_replay}"
	}
	if role != config.RoleBoth {
		// The router pairs a prefill and a decode instance that speak the
		// same protocol; SGLang's decode leg meets its prefill through the
		// prefill instance's bootstrap server.
		meta["oasis_pd_protocol"] = pdProtocol(s.Engine)
		if usesBootstrapPort(s.Engine, role) {
			meta["oasis_bootstrap_port"] = "${NOMAD_HOST_PORT_bootstrap}"
		}
	}
	if s.Engine == config.EngineLlamaCpp && s.MaxModelLen > 0 {
		// No KV events: the router models llama-server's cache (-c tokens)
		// from its own routing decisions.
		meta["oasis_kv_capacity"] = "gpu=" + strconv.Itoa(s.MaxModelLen)
	}
	if config.HasBlockSize(s.Engine) {
		bs := s.BlockSize
		if bs == 0 {
			bs = config.DefaultBlockSize
		}
		meta["oasis_block_size"] = strconv.Itoa(bs)
	}
	// Model loads take minutes: failing checks restart the task only after
	// the grace (the simulator loads nothing).
	grace := 15 * time.Minute
	if s.Engine == config.EngineSim {
		grace = 30 * time.Second
	}
	return &nomadapi.Service{
		Name:      "oasis-engine",
		Provider:  "consul",
		PortLabel: "http",
		Tags:      []string{"oasis", "engine-" + s.Engine, "role-" + role},
		Meta:      meta,
		Checks: []nomadapi.ServiceCheck{{
			Name:     "health",
			Type:     "http",
			Path:     "/health",
			Interval: 10 * time.Second,
			Timeout:  3 * time.Second,
			CheckRestart: &nomadapi.CheckRestart{
				Limit: 3,
				Grace: ptr[time.Duration](grace),
			},
		}},
	}
}

// metricsPath is where the engine serves Prometheus metrics (as the
// driver's renderer says).
func metricsPath(engine string) string {
	if engine == config.EngineTRTLLM {
		return "/prometheus/metrics"
	}
	return "/metrics"
}

// Drain bounds, as the recipes set them (nomad-driver/README, Draining):
// Nomad deregisters an engine's service, waits shutdown_delay for requests
// already on their way to it, and the llm driver then waits for the
// engine's requests in flight, up to kill_timeout, before it signals.
const (
	shutdownDelaySim    = 2 * time.Second   // oasis-sim answers within seconds
	shutdownDelayEngine = 5 * time.Second   // real engines: a request routed just before the deregistration
	killTimeoutSim      = 30 * time.Second  // the longest sim answer at speed 1
	killTimeoutPrefill  = 60 * time.Second  // a prefill leg is one long prompt's prefill
	killTimeoutEngine   = 120 * time.Second // a few thousand tokens at tens of tokens per second
	killTimeoutLarge    = 180 * time.Second // tensor parallel ≥ 4 (70B class): slower decode
)

// shutdownDelay is an engine group's shutdown_delay.
func shutdownDelay(s modelSpec) time.Duration {
	if s.Engine == config.EngineSim {
		return shutdownDelaySim
	}
	return shutdownDelayEngine
}

// killTimeout is an engine task's kill_timeout: how long the driver lets
// its requests in flight finish. Nomad clients cap it at max_kill_timeout
// (30 s unless raised).
func killTimeout(s modelSpec, role string) time.Duration {
	switch {
	case s.Engine == config.EngineSim:
		return killTimeoutSim
	case role == config.RolePrefill:
		return killTimeoutPrefill
	case s.TensorParallelSize >= 4:
		return killTimeoutLarge
	}
	return killTimeoutEngine
}

// renderTask is the llm driver task of one engine role.
func renderTask(s modelSpec, role string) *nomadapi.Task {
	kill := killTimeout(s, role)
	cpu, mem := s.CPU, s.MemoryMB
	res := &nomadapi.Resources{CPU: ptr(cpu), MemoryMB: ptr(mem)}
	if n := s.gpuCount(); n > 0 {
		res.Devices = []*nomadapi.RequestedDevice{{Name: "nvidia/gpu", Count: ptr(uint64(n))}}
	}
	t := &nomadapi.Task{
		Name:        strings.ReplaceAll(s.Engine, "_", "-"),
		Driver:      "llm",
		Config:      renderTaskConfig(s, role),
		KillSignal:  "SIGTERM",
		KillTimeout: ptr[time.Duration](kill),
		Resources:   res,
	}
	if s.KVOffloadTier != "" {
		// The driver reads the tier with the task's workload identity.
		t.Identity = &nomadapi.WorkloadIdentity{File: true}
	}
	return t
}

// renderTaskConfig is the llm driver's config block: only what is set, so
// the driver's defaults apply to the rest.
func renderTaskConfig(s modelSpec, role string) map[string]interface{} {
	c := map[string]interface{}{
		"engine":            s.Engine,
		"model":             s.Model,
		"served_model_name": s.Name,
		"port":              "http",
	}
	if config.SupportsKVEvents(s.Engine) {
		c["kv_events_port"] = "kv_events"
		c["kv_events_replay_port"] = "kv_events_replay"
	}
	if role != config.RoleBoth {
		c["role"] = role
	}
	if s.KVOffloadTier != "" {
		c["kv_offload_tier"] = s.KVOffloadTier
	}
	// A tier renders kv_offload and its size (a disaggregated vLLM renders
	// its NIXL connector from the role alone); one set beside it is passed
	// on for the driver to refuse.
	if off := s.kvOffload(); off != config.OffloadNone && (s.KVOffloadTier == "" || s.KVOffload != "") {
		c["kv_offload"] = off
	}
	if usesNIXLPort(s.Engine, role) {
		c["nixl_side_channel_port"] = "nixl"
	}
	if usesBootstrapPort(s.Engine, role) {
		c["bootstrap_port"] = "bootstrap"
	}
	setPositive(c, "tensor_parallel_size", float64(s.TensorParallelSize), s.TensorParallelSize)
	setPositive(c, "max_model_len", float64(s.MaxModelLen), s.MaxModelLen)
	setPositive(c, "block_size", float64(s.BlockSize), s.BlockSize)
	setPositive(c, "gpu_memory_utilization", s.GPUMemoryUtilization, s.GPUMemoryUtilization)
	setPositive(c, "kv_offload_size_gb", s.KVOffloadSizeGB, s.KVOffloadSizeGB)
	if len(s.ExtraArgs) > 0 {
		c["extra_args"] = s.ExtraArgs
	}
	if s.EngineBinary != "" {
		c["binary"] = s.EngineBinary
	}
	if s.EngineImage != "" {
		c["image"] = s.EngineImage
	}
	return c
}

// setPositive sets key to v unless n is zero ("not set"); negative values
// are kept so the driver's validation names them.
func setPositive(c map[string]interface{}, key string, n float64, v any) {
	if n != 0 {
		c[key] = v
	}
}

// specHash hashes what the job runs apart from where it runs and how many
// instances (region and namespace force a new resource; counts are
// attributes of their own, read back from the job).
func specHash(job *nomadapi.Job) (string, error) {
	b, err := json.Marshal(job)
	if err != nil {
		return "", fmt.Errorf("encoding job: %w", err)
	}
	var c nomadapi.Job
	if err := json.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("copying job: %w", err)
	}
	c.Region, c.Namespace, c.Meta = nil, nil, nil
	for _, g := range c.TaskGroups {
		g.Count = nil
	}
	b, err = json.Marshal(&c)
	if err != nil {
		return "", fmt.Errorf("encoding job: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12]), nil
}

// ptr returns a pointer to v (the Nomad API's optional fields).
func ptr[T any](v T) *T { return &v }
