// Package drivers is Oasis's side of Nomad's task driver plugin protocol
// (v0.1.0): the Go types a driver works with (named like those of Nomad's
// plugin SDK), their conversions to and from the wire messages declared in
// internal/nomadplugin/proto/drivers, the gRPC server a Nomad client talks
// to, a client for tests, a task event fan-out (Eventer) and Serve.
package drivers

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"time"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// ApiVersion010 is the driver protocol version a driver reports in
// PluginInfo.
const ApiVersion010 = "v0.1.0"

// ErrTaskNotFound is returned for a task id the driver does not know.
// Across the wire it travels as codes.NotFound with this message, which
// is how Nomad's client recognises it.
var ErrTaskNotFound = errors.New("task not found for given id")

// DriverPlugin is the interface of a task driver.
type DriverPlugin interface {
	base.BasePlugin

	TaskConfigSchema() (*hclspec.Spec, error)
	Capabilities() (*Capabilities, error)
	Fingerprint(ctx context.Context) (<-chan *Fingerprint, error)

	RecoverTask(handle *TaskHandle) error
	StartTask(cfg *TaskConfig) (*TaskHandle, *DriverNetwork, error)
	WaitTask(ctx context.Context, taskID string) (<-chan *ExitResult, error)
	StopTask(taskID string, timeout time.Duration, signal string) error
	DestroyTask(taskID string, force bool) error
	InspectTask(taskID string) (*TaskStatus, error)
	TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *TaskResourceUsage, error)
	TaskEvents(ctx context.Context) (<-chan *TaskEvent, error)

	SignalTask(taskID string, signal string) error
	ExecTask(taskID string, cmd []string, timeout time.Duration) (*ExecTaskResult, error)
}

// ExecTaskStreamingRawDriver is a driver that serves `nomad alloc exec`
// on the raw message stream.
type ExecTaskStreamingRawDriver interface {
	ExecTaskStreamingRaw(ctx context.Context, taskID string, command []string, tty bool, stream ExecTaskStream) error
}

// ExecTaskStreamingDriver is a driver that serves `nomad alloc exec` on
// plain readers and writers; the server adapts the message stream to them.
type ExecTaskStreamingDriver interface {
	ExecTaskStreaming(ctx context.Context, taskID string, opts *ExecOptions) (*ExitResult, error)
}

// ExecTaskStream is the message stream of one streaming exec session.
type ExecTaskStream interface {
	Send(*ExecTaskStreamingResponseMsg) error
	Recv() (*ExecTaskStreamingRequestMsg, error)
}

// ExecTaskStreamingRequestMsg and ExecTaskStreamingResponseMsg are the
// wire messages of a streaming exec session.
type (
	ExecTaskStreamingRequestMsg  = driverspb.ExecTaskStreamingRequest
	ExecTaskStreamingResponseMsg = driverspb.ExecTaskStreamingResponse
)

// ExecOptions are a streaming exec session as readers and writers.
type ExecOptions struct {
	Command  []string
	Tty      bool
	Stdin    io.ReadCloser
	Stdout   io.WriteCloser
	Stderr   io.WriteCloser
	ResizeCh <-chan TerminalSize
}

// TerminalSize is a terminal's size in characters.
type TerminalSize struct {
	Height int
	Width  int
}

// HealthState is a driver's health as fingerprinted.
type HealthState string

const (
	HealthStateUndetected HealthState = "undetected"
	HealthStateUnhealthy  HealthState = "unhealthy"
	HealthStateHealthy    HealthState = "healthy"
)

// Fingerprint is one fingerprint of the driver: node attributes and health.
type Fingerprint struct {
	Attributes        map[string]*structs.Attribute
	Health            HealthState
	HealthDescription string
	// Err is not sent to Nomad; a driver may set it for its own logs.
	Err error
}

// FSIsolation is the filesystem isolation a driver gives its tasks.
type FSIsolation string

const (
	FSIsolationNone   FSIsolation = "none"
	FSIsolationChroot FSIsolation = "chroot"
	FSIsolationImage  FSIsolation = "image"
	FSIsolationUnveil FSIsolation = "unveil"
)

// NetIsolationMode is a network isolation mode a driver supports.
type NetIsolationMode string

const (
	NetIsolationModeHost  NetIsolationMode = "host"
	NetIsolationModeGroup NetIsolationMode = "group"
	NetIsolationModeTask  NetIsolationMode = "task"
	NetIsolationModeNone  NetIsolationMode = "none"
)

// MountConfigSupport says whether the driver takes volume mounts.
type MountConfigSupport int32

const (
	MountConfigSupportAll MountConfigSupport = iota
	MountConfigSupportNone
)

// Capabilities are what a driver supports.
type Capabilities struct {
	SendSignals          bool
	Exec                 bool
	FSIsolation          FSIsolation
	NetIsolationModes    []NetIsolationMode
	MustInitiateNetwork  bool
	MountConfigs         MountConfigSupport
	DisableLogCollection bool
	DynamicWorkloadUsers bool
}

// NetworkIsolationSpec is the network namespace Nomad made for a task.
type NetworkIsolationSpec struct {
	Mode        NetIsolationMode
	Path        string
	Labels      map[string]string
	HostsConfig *HostsConfig
}

// HostsConfig is the hostname and address of a group's namespace.
type HostsConfig struct {
	Hostname string
	Address  string
}

// DNSConfig is a task's DNS configuration.
type DNSConfig struct {
	Servers  []string
	Searches []string
	Options  []string
}

// TaskConfig is a task as the client hands it to StartTask.
type TaskConfig struct {
	ID               string
	JobName          string
	JobID            string
	TaskGroupName    string
	ParentJobID      string
	Name             string
	Namespace        string
	NodeName         string
	NodeID           string
	Env              map[string]string
	DeviceEnv        map[string]string
	Resources        *Resources
	Devices          []*DeviceConfig
	Mounts           []*MountConfig
	User             string
	AllocDir         string
	StdoutPath       string
	StderrPath       string
	AllocID          string
	NetworkIsolation *NetworkIsolationSpec
	DNS              *DNSConfig

	rawDriverConfig []byte
}

// TaskDir is the layout of a task's directories, as Nomad's client
// builds it.
type TaskDir struct {
	Dir            string // <alloc dir>/<task>
	SharedAllocDir string // <alloc dir>/alloc
	LogDir         string // <alloc dir>/alloc/logs
	SharedTaskDir  string // <task dir>/alloc
	LocalDir       string // <task dir>/local
	SecretsDir     string // <task dir>/secrets
	PrivateDir     string // <task dir>/private
}

// TaskDir returns the task's directories under its AllocDir.
func (tc *TaskConfig) TaskDir() *TaskDir {
	dir := filepath.Join(tc.AllocDir, tc.Name)
	return &TaskDir{
		Dir:            dir,
		SharedAllocDir: filepath.Join(tc.AllocDir, "alloc"),
		LogDir:         filepath.Join(tc.AllocDir, "alloc", "logs"),
		SharedTaskDir:  filepath.Join(dir, "alloc"),
		LocalDir:       filepath.Join(dir, "local"),
		SecretsDir:     filepath.Join(dir, "secrets"),
		PrivateDir:     filepath.Join(dir, "private"),
	}
}

// DecodeDriverConfig decodes the task's driver config (msgpack, as the
// client encodes it from the task's HCL against TaskConfigSchema) into out,
// a struct with `codec` tags.
func (tc *TaskConfig) DecodeDriverConfig(out any) error {
	return base.MsgPackDecode(tc.rawDriverConfig, out)
}

// EncodeConcreteDriverConfig sets the task's driver config from a struct
// with `codec` tags (tests).
func (tc *TaskConfig) EncodeConcreteDriverConfig(in any) error {
	var b []byte
	if err := base.MsgPackEncode(&b, in); err != nil {
		return err
	}
	tc.rawDriverConfig = b
	return nil
}

// EncodeDriverConfig sets the task's raw driver config bytes (cty msgpack,
// as hclspec.Encode produces them).
func (tc *TaskConfig) EncodeDriverConfig(raw []byte) { tc.rawDriverConfig = raw }

// Resources are a task's allocated resources.
type Resources struct {
	NomadResources *AllocatedTaskResources
	LinuxResources *LinuxResources
	Ports          []PortMapping
}

// Copy returns a deep copy.
func (r *Resources) Copy() *Resources {
	if r == nil {
		return nil
	}
	out := &Resources{Ports: append([]PortMapping(nil), r.Ports...)}
	if r.NomadResources != nil {
		nr := *r.NomadResources
		out.NomadResources = &nr
	}
	if r.LinuxResources != nil {
		lr := *r.LinuxResources
		out.LinuxResources = &lr
	}
	return out
}

// AllocatedTaskResources are the CPU and memory Nomad reserved for a task.
type AllocatedTaskResources struct {
	CPUShares   int64
	MemoryMB    int64
	MemoryMaxMB int64
}

// LinuxResources are a task's resources as cgroup settings.
type LinuxResources struct {
	CPUPeriod        int64
	CPUQuota         int64
	CPUShares        int64
	MemoryLimitBytes int64
	OOMScoreAdj      int64
	CpusetCpus       string
	CpusetCgroupPath string
	PercentTicks     float64
}

// PortMapping is one port of the task's group network: its label, the
// host's address and port, and the port inside a bridge namespace (To).
type PortMapping struct {
	Label  string
	Value  int
	To     int
	HostIP string
}

// DeviceConfig is a device node exposed to a task.
type DeviceConfig struct {
	TaskPath    string
	HostPath    string
	Permissions string
}

// MountConfig is a volume mount of a task.
type MountConfig struct {
	TaskPath        string
	HostPath        string
	Readonly        bool
	PropagationMode string
	SELinuxLabel    string
}

// TaskState is a task's run state.
type TaskState string

const (
	TaskStateUnknown TaskState = "unknown"
	TaskStateRunning TaskState = "running"
	TaskStateExited  TaskState = "exited"
)

// ExitResult is how a task ended.
type ExitResult struct {
	ExitCode  int
	Signal    int
	OOMKilled bool
	Err       error
}

// Successful reports a clean exit.
func (r *ExitResult) Successful() bool {
	return r.ExitCode == 0 && r.Signal == 0 && r.Err == nil
}

// Copy returns a copy (nil for nil).
func (r *ExitResult) Copy() *ExitResult {
	if r == nil {
		return nil
	}
	c := *r
	return &c
}

// TaskStatus is what InspectTask reports.
type TaskStatus struct {
	ID               string
	Name             string
	State            TaskState
	StartedAt        time.Time
	CompletedAt      time.Time
	ExitResult       *ExitResult
	DriverAttributes map[string]string
	NetworkOverride  *DriverNetwork
}

// TaskEvent is a message about a task the client adds to its event list.
type TaskEvent struct {
	TaskID      string
	TaskName    string
	AllocID     string
	Timestamp   time.Time
	Message     string
	Annotations map[string]string
	// Err is not sent to Nomad.
	Err error
}

// ExecTaskResult is the outcome of a one-shot exec.
type ExecTaskResult struct {
	Stdout     []byte
	Stderr     []byte
	ExitResult *ExitResult
}

// DriverNetwork is the address and ports a driver says its task uses,
// overriding the group network's (drivers that make their own network).
type DriverNetwork struct {
	PortMap       map[string]int
	IP            string
	AutoAdvertise bool
}

// MemoryStats is a task's memory usage; Measured names the fields sampled
// ("RSS", "Cache", "Swap", "Usage", "Max Usage", "Kernel Usage",
// "Kernel Max Usage").
type MemoryStats struct {
	RSS            uint64
	Cache          uint64
	Swap           uint64
	MappedFile     uint64
	Usage          uint64
	MaxUsage       uint64
	KernelUsage    uint64
	KernelMaxUsage uint64
	Measured       []string
}

// CpuStats is a task's CPU usage; Measured names the fields sampled
// ("System Mode", "User Mode", "Total Ticks", "Throttled Periods",
// "Throttled Time", "Percent").
type CpuStats struct {
	SystemMode       float64
	UserMode         float64
	TotalTicks       float64
	ThrottledPeriods uint64
	ThrottledTime    uint64
	Percent          float64
	Measured         []string
}

// ResourceUsage is memory and CPU usage.
type ResourceUsage struct {
	MemoryStats *MemoryStats
	CpuStats    *CpuStats
}

// TaskResourceUsage is a task's usage at Timestamp (Unix nanoseconds), in
// all and per process id.
type TaskResourceUsage struct {
	ResourceUsage *ResourceUsage
	Timestamp     int64
	Pids          map[string]*ResourceUsage
}
