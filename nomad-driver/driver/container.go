package driver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
	"github.com/oasis-llm/oasis/nomad-driver/render"
)

// ErrContainerExec is returned for exec into a task that runs from an image.
var ErrContainerExec = errors.New("exec into engines started from an image is not supported; use `podman exec` on the client")

// containerTask is the container that runs a task's engine (image tasks).
type containerTask struct {
	api *podmanClient
	id  string
	// logsDone is closed when the log stream has ended (the container
	// exited and its last lines reached Nomad's FIFOs).
	logsDone chan struct{}
	// logCtx bounds the log stream; cancelled by DestroyTask.
	logCtx    context.Context
	logCancel context.CancelFunc
}

func newContainerTask(api *podmanClient, id string) *containerTask {
	ctx, cancel := context.WithCancel(context.Background())
	return &containerTask{api: api, id: id, logsDone: make(chan struct{}), logCtx: ctx, logCancel: cancel}
}

// containerName is unique per task and allocation; a container left by an
// earlier attempt of the same task is removed before a new one is created.
func containerName(cfg *drivers.TaskConfig) string {
	return "oasis-" + cfg.Name + "-" + cfg.AllocID
}

// containerEnv is the engine's environment in the container: the task's
// (minus PATH: the image's own PATH finds the engine) and the plan's.
func containerEnv(cfg *drivers.TaskConfig, plan *render.Plan) map[string]string {
	env := make(map[string]string, len(cfg.Env)+len(plan.Env))
	for k, v := range cfg.Env {
		if k != "PATH" {
			env[k] = v
		}
	}
	for k, v := range plan.Env {
		env[k] = v
	}
	return env
}

// cdiDevices names the GPUs Nomad reserved for the task as CDI devices, as
// NVIDIA's container toolkit generates them (`nvidia-ctk cdi generate`
// names each GPU by index and by UUID, which Nomad's device plugin uses).
func cdiDevices(gpus []string) []device {
	out := make([]device, 0, len(gpus))
	for _, id := range gpus {
		out = append(out, device{Path: "nvidia.com/gpu=" + id})
	}
	return out
}

// buildContainerSpec turns a rendered plan into the container to create:
// the same argv and environment, the task and allocation directories
// mounted at their host paths (files the plan wrote and paths it renders
// stay valid), the reserved GPUs, and the allocation's network.
func buildContainerSpec(cfg *drivers.TaskConfig, plan *render.Plan) *containerSpec {
	td := cfg.TaskDir()
	spec := &containerSpec{
		Name:       containerName(cfg),
		Image:      plan.Config.Image,
		Entrypoint: []string{plan.Argv[0]},
		Command:    plan.Argv[1:],
		Env:        containerEnv(cfg, plan),
		User:       cfg.User,
		NetNS:      namespace{NSMode: "host"},
		Devices:    cdiDevices(render.GPUsFromEnv(cfg.Env)),
		StopSignal: int(unix.SIGTERM),
		Labels: map[string]string{
			"io.oasis.alloc_id": cfg.AllocID,
			"io.oasis.task":     cfg.Name,
			"io.oasis.engine":   plan.Config.Engine,
		},
	}
	if td.Dir != "" {
		spec.WorkDir = td.Dir
		for _, dir := range []string{td.SharedAllocDir, td.Dir} {
			if dir != "" {
				spec.Mounts = append(spec.Mounts, mount{Destination: dir, Source: dir, Type: "bind", Options: []string{"rbind", "rw"}})
			}
		}
	}
	if p := netNSPath(cfg); p != "" {
		spec.NetNS = namespace{NSMode: "path", Value: p}
	}
	if cfg.Resources != nil && cfg.Resources.LinuxResources != nil {
		lr := cfg.Resources.LinuxResources
		r := &resources{}
		if lr.MemoryLimitBytes > 0 {
			r.Memory = &struct {
				Limit int64 `json:"limit,omitempty"`
			}{Limit: lr.MemoryLimitBytes}
		}
		if lr.CPUShares > 0 {
			r.CPU = &struct {
				Shares uint64 `json:"shares,omitempty"`
			}{Shares: uint64(lr.CPUShares)}
		}
		if r.Memory != nil || r.CPU != nil {
			spec.Resources = r
		}
	}
	return spec
}

// engineEntrypoint is the engine's command in the image: the image's own
// entrypoint where it is the same program (llama.cpp's server images run
// /app/llama-server, which is not on their PATH), else the rendered name
// looked up on the image's PATH.
func engineEntrypoint(rendered, image []string) []string {
	if len(image) > 0 && len(rendered) == 1 && path.Base(image[0]) == path.Base(rendered[0]) {
		return []string{image[0]}
	}
	return rendered
}

// ensureImage finds the task's image locally or pulls it, reporting the
// pull as task events.
func (d *Driver) ensureImage(ctx context.Context, api *podmanClient, cfg *drivers.TaskConfig, plan *render.Plan) error {
	ref := plan.Config.Image
	ok, err := api.ImageExists(ctx, ref)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	user, password := "", ""
	if a := plan.Config.Auth; a != nil {
		user, password = a.Username, a.Password
	}
	d.emit(cfg, fmt.Sprintf("Pulling image %s", ref), nil)
	start := time.Now()
	id, err := api.Pull(ctx, ref, user, password, func(line string) {
		if line != "" {
			d.emit(cfg, "Pulling image "+ref+": "+line, nil)
		}
	})
	if err != nil {
		return err
	}
	d.emit(cfg, fmt.Sprintf("Pulled image %s (%.12s) in %.1f s", ref, id, time.Since(start).Seconds()), nil)
	return nil
}

// startContainer is StartTask for a task with an image.
func (d *Driver) startContainer(cfg *drivers.TaskConfig, handle *drivers.TaskHandle, st TaskState, plan *render.Plan, logger hclog.Logger, called time.Time) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	pc, _ := d.pluginConfig()
	cc := pc.Container.WithDefaults()
	api := newPodmanClient(cc.SocketPath())
	ctx, cancel := context.WithTimeout(d.ctx, 30*time.Minute) // pulls of engine images take minutes
	defer cancel()

	if _, err := api.Version(ctx); err != nil {
		return nil, nil, structs.NewRecoverableError(fmt.Errorf("image: container runtime %s unreachable at %s (plugin config container { socket }): %w", cc.Runtime, cc.Socket, err), true)
	}
	if err := d.ensureImage(ctx, api, cfg, plan); err != nil {
		msg := fmt.Sprintf("Image %s is not available: not in the runtime's local storage and the pull failed: %v", plan.Config.Image, err)
		d.emit(cfg, msg, map[string]string{"image": plan.Config.Image})
		return nil, nil, structs.NewRecoverableError(errors.New("image: "+msg), true)
	}
	if err := writePlanFiles(plan.Files, cfg.User, true); err != nil {
		return nil, nil, structs.NewRecoverableError(err, true)
	}
	spec := buildContainerSpec(cfg, plan)
	if ep, err := api.ImageEntrypoint(ctx, plan.Config.Image); err == nil {
		spec.Entrypoint = engineEntrypoint(spec.Entrypoint, ep)
	}
	user := cfg.User
	if user == "" {
		user = "the image's user"
	}
	d.emit(cfg, fmt.Sprintf("Starting %s engine from image %s: %s", plan.Config.Engine, plan.Config.Image, strings.Join(redact(plan.Argv), " ")),
		map[string]string{"user": user, "image": plan.Config.Image})

	if err := api.Remove(ctx, spec.Name); err != nil {
		return nil, nil, structs.NewRecoverableError(fmt.Errorf("removing the container of an earlier attempt: %w", err), true)
	}
	id, err := api.Create(ctx, spec)
	if err != nil {
		return nil, nil, structs.NewRecoverableError(fmt.Errorf("creating container: %w", err), true)
	}
	ct := newContainerTask(api, id)
	// Attach the log stream before the engine runs, so its first lines reach Nomad.
	logsAttached := make(chan struct{})
	go d.streamLogs(ct, cfg, time.Time{}, logsAttached)
	if err := api.Start(ctx, id); err != nil {
		ct.logCancel()
		_ = api.Remove(context.Background(), id)
		return nil, nil, structs.NewRecoverableError(fmt.Errorf("starting container: %w", err), true)
	}
	cs, err := api.Inspect(ctx, id)
	if err != nil {
		ct.logCancel()
		_ = api.Remove(context.Background(), id)
		return nil, nil, structs.NewRecoverableError(fmt.Errorf("inspecting container: %w", err), true)
	}
	st.Pid, st.StartedAt = cs.Pid, time.Now()
	st.ContainerID, st.ContainerSocket, st.Image = id, cc.Socket, plan.Config.Image
	if err := handle.SetDriverState(&st); err != nil {
		ct.logCancel()
		_ = api.Remove(context.Background(), id)
		return nil, nil, fmt.Errorf("storing driver state: %w", err)
	}
	h := newHandle(logger, st)
	h.ctr, h.called = ct, called
	d.tasks.Set(cfg.ID, h)
	d.emit(cfg, fmt.Sprintf("Loading model %s (container %.12s, pid %d)", plan.Config.Model, id, cs.Pid), nil)
	go d.waitContainer(h)
	go d.watchHealth(h, false)
	return handle, nil, nil
}

// recoverContainer is RecoverTask for a task with an image: it re-attaches
// to the container by the id stored in the driver state.
func (d *Driver) recoverContainer(h *taskHandle) error {
	st := h.state
	api := newPodmanClient(strings.TrimPrefix(st.ContainerSocket, "unix://"))
	cs, err := api.Inspect(d.ctx, st.ContainerID)
	if err != nil {
		return fmt.Errorf("recovering task %s: container %.12s: %w", h.taskConfig.ID, st.ContainerID, err)
	}
	h.state.Pid = cs.Pid
	h.ctr = newContainerTask(api, st.ContainerID)
	d.tasks.Set(h.taskConfig.ID, h)
	// Lines written while the client was down are in the container's log;
	// resume from now so Nomad's log files get no duplicates.
	go d.streamLogs(h.ctr, h.taskConfig, time.Now(), nil)
	go d.waitContainer(h)
	go d.watchHealth(h, true)
	return nil
}

// streamLogs copies the container's stdout and stderr into the task's
// FIFOs (Nomad's logmon writes them to alloc/logs). It returns when the
// container has exited or the task is destroyed; attached is closed once
// the stream is open.
func (d *Driver) streamLogs(ct *containerTask, cfg *drivers.TaskConfig, since time.Time, attached chan struct{}) {
	defer close(ct.logsDone)
	var once sync.Once
	signalAttached := func() {
		if attached != nil {
			once.Do(func() { close(attached) })
		}
	}
	defer signalAttached()
	stdout, err := openFIFOWriter(cfg.StdoutPath)
	if err != nil {
		d.logger.Error("opening stdout fifo", "task_id", cfg.ID, "error", err)
		return
	}
	defer stdout.Close()
	stderr, err := openFIFOWriter(cfg.StderrPath)
	if err != nil {
		d.logger.Error("opening stderr fifo", "task_id", cfg.ID, "error", err)
		return
	}
	defer stderr.Close()
	for {
		signalAttached()
		err := ct.api.Logs(ct.logCtx, ct.id, since, stdout, stderr)
		if ct.logCtx.Err() != nil {
			return
		}
		// The stream ends when the container exits, or when the runtime's
		// service restarts: resume unless the container is gone or done.
		cs, ierr := ct.api.Inspect(ct.logCtx, ct.id)
		if ierr == nil && !cs.Running && cs.Status != "created" && cs.Status != "initialized" {
			return
		}
		var pe *PodmanError
		if errors.As(ierr, &pe) && pe.Status == http.StatusNotFound {
			return
		}
		if err != nil {
			d.logger.Debug("container log stream ended; resuming", "container", ct.id, "error", err)
		}
		since = time.Now()
		if ctxsleep.Sleep(ct.logCtx, time.Second) != nil {
			return
		}
	}
}

// waitContainer blocks until the container exits (run for image tasks).
func (d *Driver) waitContainer(h *taskHandle) {
	defer close(h.doneCh)
	defer h.cancel()
	ct := h.ctr
	var code int
	for {
		var err error
		code, err = ct.api.Wait(ct.logCtx, ct.id)
		if err == nil {
			break
		}
		var pe *PodmanError
		if ct.logCtx.Err() != nil || (errors.As(err, &pe) && pe.Status == http.StatusNotFound) {
			h.exited(&drivers.ExitResult{ExitCode: -1, Err: fmt.Errorf("container %.12s: %w", ct.id, err)}, time.Now())
			return
		}
		// The runtime's service restarted (socket activation): wait again.
		h.logger.Warn("waiting on container", "container", ct.id, "error", err)
		if ctxsleep.Sleep(ct.logCtx, time.Second) != nil {
			h.exited(&drivers.ExitResult{ExitCode: -1, Err: fmt.Errorf("container %.12s: %w", ct.id, err)}, time.Now())
			return
		}
	}
	res := &drivers.ExitResult{ExitCode: code}
	at := time.Now()
	if cs, err := ct.api.Inspect(context.Background(), ct.id); err == nil {
		res.OOMKilled = cs.OOMKilled
		if !cs.FinishedAt.IsZero() {
			at = cs.FinishedAt
		}
	}
	// A process killed by a signal exits 128+signal in a container.
	if code > 128 && code < 128+65 {
		res.Signal = code - 128
	}
	// Let the last lines reach the FIFOs before the exit is reported.
	select {
	case <-ct.logsDone:
	case <-time.After(5 * time.Second):
	}
	h.exited(res, at)
	if h.stopping.Load() {
		d.emit(h.taskConfig, fmt.Sprintf("Engine stopped (exit code %d, signal %d)", res.ExitCode, res.Signal), nil)
		return
	}
	msg := fmt.Sprintf("Engine exited with code %d", code)
	if res.OOMKilled {
		msg += " (out of memory)"
	}
	time.Sleep(300 * time.Millisecond) // logmon flushes the FIFO into the log file
	if lines := stderrTail(h.taskConfig, 20, 2048); lines != "" {
		msg += "; last stderr lines:\n" + lines
	}
	d.emit(h.taskConfig, msg, map[string]string{"exit_code": strconv.Itoa(code)})
}

// stopContainer signals the engine (default SIGTERM), waits up to timeout
// for it to drain and exit, then kills it.
func (d *Driver) stopContainer(h *taskHandle, timeout time.Duration, signal string) error {
	if signal == "" {
		signal = "SIGTERM"
	}
	ct := h.ctr
	ctx := context.Background()
	if err := ct.api.Kill(ctx, ct.id, strings.ToUpper(signal)); err != nil && h.IsRunning() {
		var pe *PodmanError
		// 409: the container is not running any more.
		if !errors.As(err, &pe) || pe.Status != http.StatusConflict {
			return fmt.Errorf("stopping engine: %w", err)
		}
	}
	select {
	case <-h.doneCh:
		return nil
	case <-time.After(timeout):
	}
	h.logger.Info("engine did not exit within kill_timeout; killing it", "timeout", timeout)
	if err := ct.api.Kill(ctx, ct.id, "SIGKILL"); err != nil {
		var pe *PodmanError
		if !errors.As(err, &pe) || pe.Status != http.StatusConflict {
			return fmt.Errorf("killing engine: %w", err)
		}
	}
	<-h.doneCh
	return nil
}

// destroyContainer removes the container (killing it if it still runs).
func (d *Driver) destroyContainer(h *taskHandle) {
	ct := h.ctr
	if err := ct.api.Remove(context.Background(), ct.id); err != nil {
		h.logger.Error("removing container", "container", ct.id, "error", err)
	}
	ct.logCancel()
}

// signalContainer sends a signal to the engine in the container.
func (d *Driver) signalContainer(h *taskHandle, signal string) error {
	sig := strings.ToUpper(signal)
	if unix.SignalNum(sig) == 0 {
		return fmt.Errorf("unknown signal %q", signal)
	}
	return h.ctr.api.Kill(context.Background(), h.ctr.id, sig)
}

// containerStats reports the container's memory and CPU every interval.
func (d *Driver) containerStats(ctx context.Context, h *taskHandle, interval time.Duration) (<-chan *drivers.TaskResourceUsage, error) {
	ch := make(chan *drivers.TaskResourceUsage)
	go func() {
		defer close(ch)
		var prevCPU, prevSys uint64
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s, err := h.ctr.api.Stats(ctx, h.ctr.id)
			if err == nil {
				u := containerUsage(s, prevCPU, prevSys, d.cpuTotalTicks())
				prevCPU, prevSys = s.CPUStats.CPUUsage.TotalUsage, s.CPUStats.SystemUsage
				select {
				case ch <- u:
				case <-ctx.Done():
					return
				}
			} else if ctx.Err() == nil {
				h.logger.Debug("container stats", "error", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-h.doneCh:
				return
			case <-t.C:
			}
		}
	}()
	return ch, nil
}

// containerUsage converts the runtime's stats into Nomad's, as Nomad's
// docker driver does: CPU percent from the deltas since the previous
// sample, ticks as that share of the node's compute.
func containerUsage(s *containerStats, prevCPU, prevSys uint64, totalCompute float64) *drivers.TaskResourceUsage {
	ms := &drivers.MemoryStats{
		Usage:    s.MemoryStats.Usage,
		RSS:      s.MemoryStats.Stats["rss"],
		Cache:    s.MemoryStats.Stats["cache"],
		Measured: []string{"RSS", "Cache", "Usage"},
	}
	cs := &drivers.CpuStats{
		ThrottledPeriods: s.CPUStats.Throttling.ThrottledPeriods,
		ThrottledTime:    s.CPUStats.Throttling.ThrottledTime,
		Measured:         []string{"Throttled Periods", "Throttled Time", "Percent", "Total Ticks"},
	}
	if prevSys != 0 && s.CPUStats.SystemUsage > prevSys && s.CPUStats.CPUUsage.TotalUsage >= prevCPU {
		cpus := float64(s.CPUStats.OnlineCPUs)
		if cpus == 0 {
			cpus = float64(runtime.NumCPU())
		}
		cs.Percent = float64(s.CPUStats.CPUUsage.TotalUsage-prevCPU) / float64(s.CPUStats.SystemUsage-prevSys) * cpus * 100
		cs.TotalTicks = cs.Percent / 100 * totalCompute / cpus
	}
	ts := s.Read
	if ts.IsZero() {
		ts = time.Now()
	}
	return &drivers.TaskResourceUsage{Timestamp: ts.UnixNano(), ResourceUsage: &drivers.ResourceUsage{MemoryStats: ms, CpuStats: cs}}
}
