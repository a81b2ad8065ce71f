package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/nomad-driver/supervisor"
)

// TaskState is stored in the task handle's driver state; RecoverTask
// rebuilds the handle from it after a Nomad client restart.
type TaskState struct {
	// Supervisor reaches the supervisor process that runs the engine; nil
	// for openai_compat (no process) and image tasks (a container).
	Supervisor *supervisor.State
	// LegacyExecutor is set in handles of an older nomad-driver-llm built on
	// Nomad's executor (its msgpack key, ReattachConfig); RecoverTask ends
	// that engine so the restarted task finds its ports free.
	LegacyExecutor *legacyExecutor `codec:"ReattachConfig"`
	TaskConfig     *drivers.TaskConfig
	Pid            int
	StartedAt      time.Time
	Engine         string
	Model          string
	HealthURL      string
	// HealthNetNS is the allocation's network namespace (bridge mode) the
	// health check dials HealthURL from; empty dials from the host.
	HealthNetNS   string
	HealthTimeout time.Duration
	Remote        bool
	// ContainerID, ContainerSocket and Image are set for a task run from
	// an image (container.go): RecoverTask re-attaches to the container.
	ContainerID     string
	ContainerSocket string
	Image           string
}

// taskHandle tracks one running task.
type taskHandle struct {
	logger     hclog.Logger
	taskConfig *drivers.TaskConfig
	state      TaskState

	// proc is the engine's supervisor; nil for remote (openai_compat) tasks.
	proc *supervisor.Handle
	// ctr is the container of a task run from an image (proc is nil).
	ctr *containerTask

	// ctx is cancelled when the task ends or is stopped; it bounds the
	// health watcher (and, for remote tasks, is the task's lifetime).
	ctx    context.Context
	cancel context.CancelFunc
	doneCh chan struct{}
	// called is when StartTask was entered (zero after recovery).
	called time.Time
	// stopping is set by StopTask/DestroyTask so an exit they caused is not
	// reported as a crash.
	stopping atomic.Bool

	mu          sync.RWMutex
	procState   drivers.TaskState
	completedAt time.Time
	exitResult  *drivers.ExitResult
	health      string // "starting", "ready", "failing"
	readyAfter  time.Duration

	// attached is closed by the client's first WaitTask or TaskStats call for
	// this task: its task runner is running, so the client routes the task's
	// events (see watchHealth).
	attached     chan struct{}
	attachedOnce sync.Once
}

func newHandle(logger hclog.Logger, st TaskState) *taskHandle {
	ctx, cancel := context.WithCancel(context.Background())
	return &taskHandle{
		logger:     logger,
		taskConfig: st.TaskConfig,
		state:      st,
		ctx:        ctx,
		cancel:     cancel,
		doneCh:     make(chan struct{}),
		attached:   make(chan struct{}),
		procState:  drivers.TaskStateRunning,
		health:     "starting",
	}
}

func (h *taskHandle) TaskStatus() *drivers.TaskStatus {
	h.mu.RLock()
	defer h.mu.RUnlock()
	attrs := map[string]string{
		"engine":     h.state.Engine,
		"health_url": h.state.HealthURL,
		"health":     h.health,
	}
	if h.state.Pid != 0 {
		attrs["pid"] = strconv.Itoa(h.state.Pid)
	}
	if h.readyAfter > 0 {
		attrs["ready_after_ms"] = strconv.FormatInt(h.readyAfter.Milliseconds(), 10)
	}
	return &drivers.TaskStatus{
		ID:               h.taskConfig.ID,
		Name:             h.taskConfig.Name,
		State:            h.procState,
		StartedAt:        h.state.StartedAt,
		CompletedAt:      h.completedAt,
		ExitResult:       h.exitResult.Copy(),
		DriverAttributes: attrs,
	}
}

// clientAttached records that the client's task runner uses the task.
func (h *taskHandle) clientAttached() { h.attachedOnce.Do(func() { close(h.attached) }) }

func (h *taskHandle) IsRunning() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.procState == drivers.TaskStateRunning
}

func (h *taskHandle) setHealth(s string) {
	h.mu.Lock()
	h.health = s
	h.mu.Unlock()
}

func (h *taskHandle) exited(res *drivers.ExitResult, at time.Time) {
	h.mu.Lock()
	h.procState = drivers.TaskStateExited
	if res.Err != nil && res.ExitCode == 0 && res.Signal == 0 {
		h.procState = drivers.TaskStateUnknown
	}
	h.exitResult = res
	h.completedAt = at
	h.mu.Unlock()
}

// result is the exit result once the task has ended.
func (h *taskHandle) result() *drivers.ExitResult {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.exitResult.Copy()
}

// waitProcess blocks until the engine exits (run for process tasks).
func (d *Driver) waitProcess(h *taskHandle) {
	defer close(h.doneCh)
	defer h.cancel()
	ps, err := h.proc.Wait(context.Background())
	now := time.Now()
	if err != nil {
		h.exited(&drivers.ExitResult{ExitCode: -1, Err: fmt.Errorf("supervisor: waiting on engine: %w", err)}, now)
		return
	}
	h.exited(&drivers.ExitResult{ExitCode: ps.ExitCode, Signal: ps.Signal}, ps.Time)
	if h.stopping.Load() {
		d.emit(h.taskConfig, fmt.Sprintf("Engine stopped (exit code %d, signal %d)", ps.ExitCode, ps.Signal), nil)
		return
	}
	msg := fmt.Sprintf("Engine exited with code %d", ps.ExitCode)
	if ps.Signal != 0 {
		msg += fmt.Sprintf(" (signal %d)", ps.Signal)
	}
	// Nomad's logmon copies the engine's stderr from its FIFO into the
	// task's log files; give it a moment to flush the last lines.
	time.Sleep(300 * time.Millisecond)
	if lines := stderrTail(h.taskConfig, 20, 2048); lines != "" {
		msg += "; last stderr lines:\n" + lines
	}
	d.emit(h.taskConfig, msg, map[string]string{"exit_code": strconv.Itoa(ps.ExitCode)})
}

// stderrTail returns the last lines of the task's newest rotated stderr log.
func stderrTail(tc *drivers.TaskConfig, maxLines, maxBytes int) string {
	if tc.AllocDir == "" {
		return ""
	}
	logDir := tc.TaskDir().LogDir
	matches, _ := filepath.Glob(filepath.Join(logDir, tc.Name+".stderr.*"))
	if len(matches) == 0 {
		return ""
	}
	idx := func(p string) int {
		n, _ := strconv.Atoi(p[strings.LastIndexByte(p, '.')+1:])
		return n
	}
	sort.Slice(matches, func(i, j int) bool { return idx(matches[i]) < idx(matches[j]) })
	f, err := os.Open(matches[len(matches)-1])
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-window, 0)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	out := tail(string(buf), maxLines)
	if len(out) > maxBytes {
		out = out[len(out)-maxBytes:]
	}
	return out
}

// usageToNomad converts a supervisor sample into Nomad's task usage.
func usageToNomad(u *supervisor.Usage) *drivers.TaskResourceUsage {
	var mem, cpu []string
	for _, f := range u.Measured {
		switch f {
		case "RSS", "Swap", "Cache", "Usage", "Max Usage", "Kernel Usage", "Kernel Max Usage":
			mem = append(mem, f)
		default:
			cpu = append(cpu, f)
		}
	}
	return &drivers.TaskResourceUsage{
		Timestamp: u.Timestamp.UnixNano(),
		ResourceUsage: &drivers.ResourceUsage{
			MemoryStats: &drivers.MemoryStats{RSS: u.RSS, Swap: u.Swap, Measured: mem},
			CpuStats: &drivers.CpuStats{Percent: u.Percent, UserMode: u.UserMode, SystemMode: u.SystemMode,
				TotalTicks: u.TotalTicks, Measured: cpu},
		},
	}
}

// procStats relays the supervisor's samples as Nomad's task usage until
// ctx ends or the supervisor's stream does.
func procStats(ctx context.Context, h *taskHandle, interval time.Duration) (<-chan *drivers.TaskResourceUsage, error) {
	in, err := h.proc.Stats(ctx, interval)
	if err != nil {
		return nil, fmt.Errorf("engine stats: %w", err)
	}
	out := make(chan *drivers.TaskResourceUsage)
	go func() {
		defer close(out)
		for u := range in {
			select {
			case out <- usageToNomad(u):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
