package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/render"
	"github.com/oasis-llm/oasis/nomad-driver/supervisor"
	"github.com/oasis-llm/oasis/nomad-driver/tiers"
)

// netNSPath is the allocation's own network namespace when the group asked
// for one (network mode "bridge" or "cni/..."); empty in host networking.
func netNSPath(cfg *drivers.TaskConfig) string {
	ni := cfg.NetworkIsolation
	if ni == nil || ni.Mode != drivers.NetIsolationModeGroup {
		return ""
	}
	return ni.Path
}

// ErrNoProcess is returned for process operations on openai_compat tasks.
var ErrNoProcess = errors.New("engine openai_compat runs no process")

// plan decodes and renders a task's config. Errors name the field at fault;
// they are not recoverable: restarting cannot fix a job file.
func (d *Driver) plan(cfg *drivers.TaskConfig) (*render.Plan, error) {
	var tc config.TaskConfig
	if err := cfg.DecodeDriverConfig(&tc); err != nil {
		return nil, fmt.Errorf("decoding llm task config: %w", err)
	}
	in := render.Input{
		Config:     tc,
		Ports:      map[string]render.Port{},
		GPUs:       render.GPUsFromEnv(cfg.Env),
		LocalDir:   cfg.TaskDir().LocalDir,
		SecretsDir: cfg.TaskDir().SecretsDir,
		// The supervisor starts the engine in this namespace (see launch).
		Namespaced: netNSPath(cfg) != "",
	}
	if cfg.Resources != nil {
		for _, p := range cfg.Resources.Ports {
			in.Ports[p.Label] = render.Port{HostIP: p.HostIP, Value: p.Value, To: p.To}
		}
	}
	pc, _ := d.pluginConfig()
	in.Policy, in.User = pc.Policy(), cfg.User
	// A task's own binary is resolved only where the policy allows it;
	// otherwise Render refuses it, naming the field and the plugin option.
	if tc.Engine != config.EngineOpenAICompat && slices.Contains(config.Engines, tc.Engine) && tc.Image == "" &&
		(tc.Binary == "" || in.Policy.AllowTaskBinary) {
		bin, err := resolveBinary(tc.Engine, tc.Binary, pc)
		if err != nil {
			field := "binary"
			if tc.Binary == "" {
				field = "engine"
			}
			return nil, &config.FieldError{Field: field, Msg: err.Error() +
				" (set the task's binary, or binaries in the plugin config)"}
		}
		in.Binary = bin
	}
	if tc.KVOffloadTier != "" && tc.Normalize().Validate() == nil {
		t, err := readTier(cfg, tc.KVOffloadTier)
		if err != nil {
			return nil, fmt.Errorf("invalid llm task config: %w", err)
		}
		in.Tier = t
	}
	p, err := render.Render(in)
	if err == nil {
		// Nomad hands drivers no service blocks: the meta the driver sees is
		// the job, group and task meta (NOMAD_META_*), which services
		// reference as ${NOMAD_META_<key>}. Literal service meta is checked
		// by `nomad-driver-llm validate` and the Terraform plan.
		err = p.Config.CheckServiceMeta("job/group/task", config.EnvMeta(cfg.Env))
	}
	if err != nil {
		return nil, fmt.Errorf("invalid llm task config: %w", err)
	}
	return p, nil
}

// tierReadTimeout bounds reading a tier's declaration and secret at start.
const tierReadTimeout = 10 * time.Second

// readTier reads the task's kv_offload_tier with the task's own workload
// identity through its Task API socket: a declaration changed later reaches
// new allocations only, and the ACL policies bound to the job decide which
// tiers (and secrets) it may read.
func readTier(cfg *drivers.TaskConfig, name string) (*config.Tier, error) {
	client, err := tiers.TaskAPI(cfg.TaskDir().SecretsDir, cfg.Env)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), tierReadTimeout)
	defer cancel()
	return tiers.Nomad{Client: client, Secrets: true, Namespace: cfg.Namespace}.Tier(ctx, name)
}

// taskUser is the account the engine runs as: the task's `user`, else the
// plugin's default_user when the plugin runs as root (an unprivileged
// plugin cannot switch users; its engines run as itself). A task user that
// resolves to uid 0 under another name is refused as root is.
func taskUser(cfg *drivers.TaskConfig, policy config.Policy, euid int) (string, error) {
	if cfg.User != "" {
		if u, err := user.Lookup(cfg.User); err == nil && u.Uid == "0" && policy.DefaultUser != "root" && policy.DefaultUser != "0" {
			return "", &config.FieldError{Field: "user", Msg: fmt.Sprintf(
				"%q is uid 0: tasks of driver llm run as root only where the client's plugin config sets default_user = \"root\" (this client's default: %q)",
				cfg.User, policy.DefaultUser)}
		}
		return cfg.User, nil
	}
	if euid != 0 {
		return "", nil
	}
	return policy.DefaultUser, nil
}

func (d *Driver) StartTask(cfg *drivers.TaskConfig) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	called := time.Now() // readiness is reported from here: StartTask → engine ready
	if _, ok := d.tasks.Get(cfg.ID); ok {
		return nil, nil, fmt.Errorf("task with ID %q already started", cfg.ID)
	}
	plan, err := d.plan(cfg)
	if err != nil {
		return nil, nil, err
	}
	pc, _ := d.pluginConfig()
	runAs, err := taskUser(cfg, pc.Policy(), os.Geteuid())
	if err != nil {
		return nil, nil, err
	}
	logger := d.logger.With("alloc_id", cfg.AllocID, "task_name", cfg.Name)
	st := TaskState{
		TaskConfig:    cfg,
		Engine:        plan.Config.Engine,
		Model:         plan.Config.ServedModelName,
		HealthURL:     plan.HealthURL,
		HealthTimeout: plan.Config.HealthTimeoutOrDefault(),
		Remote:        plan.NoProcess,
	}
	if plan.HealthInNamespace {
		st.HealthNetNS = netNSPath(cfg)
	}
	handle := drivers.NewTaskHandle(taskHandleVersion)
	handle.Config = cfg

	if plan.NoProcess {
		return d.startRemote(cfg, handle, st, logger)
	}
	if plan.Config.Image != "" {
		return d.startContainer(cfg, handle, st, plan, logger, called)
	}

	if err := writePlanFiles(plan.Files, runAs, false); err != nil {
		return nil, nil, structs.NewRecoverableError(err, true)
	}
	d.emit(cfg, fmt.Sprintf("Starting %s engine: %s", plan.Config.Engine, strings.Join(redact(plan.Argv), " ")),
		map[string]string{"user": displayUser(runAs)})

	proc, err := d.launch(cfg, plan, runAs, logger)
	if err != nil {
		return nil, nil, structs.NewRecoverableError(err, true)
	}
	st.Pid = proc.Pid()
	st.StartedAt = time.Now()
	sup := proc.State()
	st.Supervisor = &sup
	if err := handle.SetDriverState(&st); err != nil {
		_ = proc.Kill()
		return nil, nil, fmt.Errorf("storing driver state: %w", err)
	}
	h := newHandle(logger, st)
	h.proc, h.called = proc, called
	d.tasks.Set(cfg.ID, h)
	d.emit(cfg, fmt.Sprintf("Loading model %s (pid %d)", plan.Config.Model, st.Pid), nil)
	go d.waitProcess(h)
	go d.watchHealth(h, false)
	return handle, nil, nil
}

func (d *Driver) RecoverTask(handle *drivers.TaskHandle) error {
	if handle == nil {
		return errors.New("recovering task: nil handle")
	}
	if _, ok := d.tasks.Get(handle.Config.ID); ok {
		return nil // already attached
	}
	var st TaskState
	if err := handle.GetDriverState(&st); err != nil {
		return fmt.Errorf("decoding driver state of task %s: %w", handle.Config.ID, err)
	}
	if st.TaskConfig == nil {
		st.TaskConfig = handle.Config
	}
	logger := d.logger.With("alloc_id", handle.Config.AllocID, "task_name", handle.Config.Name)
	h := newHandle(logger, st)
	if st.Remote {
		d.tasks.Set(handle.Config.ID, h)
		go d.watchRemote(h)
		return nil
	}
	if st.ContainerID != "" {
		return d.recoverContainer(h)
	}
	if st.Supervisor == nil {
		if err := endLegacyEngine(st.LegacyExecutor, st.Pid); err != nil {
			logger.Warn("not ending an older driver's engine", "pid", st.Pid, "reason", err)
		}
		return fmt.Errorf("recovering task %s: %w", handle.Config.ID, errLegacyHandle)
	}
	ctx, cancel := context.WithTimeout(d.ctx, reattachTimeout)
	defer cancel()
	proc, err := supervisor.Reattach(ctx, d.supervisorConfig(st.TaskConfig, logger), *st.Supervisor)
	if err != nil {
		// What is left of the engine's group (a supervisor that died
		// leaves its engine's children) goes before the client restarts
		// the task.
		dctx, dcancel := context.WithTimeout(d.ctx, reattachTimeout)
		defer dcancel()
		if derr := supervisor.Destroy(dctx, *st.Supervisor); derr != nil {
			logger.Warn("removing what is left of an unreachable supervisor", "error", derr)
		}
		return fmt.Errorf("reattaching to the supervisor of task %s (engine pid %d): %w", handle.Config.ID, st.Pid, err)
	}
	h.proc = proc
	d.tasks.Set(handle.Config.ID, h)
	go d.waitProcess(h)
	go d.watchHealth(h, true)
	return nil
}

func (d *Driver) WaitTask(ctx context.Context, taskID string) (<-chan *drivers.ExitResult, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	h.clientAttached()
	ch := make(chan *drivers.ExitResult, 1)
	go func() {
		defer close(ch)
		select {
		case <-h.doneCh:
			ch <- h.result()
		case <-ctx.Done():
		case <-d.ctx.Done():
		}
	}()
	return ch, nil
}

func (d *Driver) StopTask(taskID string, timeout time.Duration, signal string) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	h.stopping.Store(true)
	// Requests on the engine finish first, within the stop timeout (drain.go).
	timeout = d.drain(h, timeout)
	if h.ctr != nil {
		return d.stopContainer(h, timeout, signal)
	}
	if h.proc == nil {
		h.cancel()
		<-h.doneCh
		return nil
	}
	// The supervisor signals the engine's process group, waits up to
	// kill_timeout, then SIGKILLs the group.
	ctx, cancel := context.WithTimeout(d.ctx, timeout+shutdownSlack)
	defer cancel()
	if err := h.proc.Shutdown(ctx, signal, timeout); err != nil {
		select {
		case <-h.doneCh: // the engine is gone all the same
		default:
			return fmt.Errorf("stopping engine: supervisor shutdown: %w", err)
		}
	}
	<-h.doneCh
	if err := h.proc.Kill(); err != nil {
		h.logger.Warn("ending the supervisor", "error", err)
	}
	return nil
}

func (d *Driver) DestroyTask(taskID string, force bool) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.IsRunning() && !force {
		return errors.New("cannot destroy a running task")
	}
	h.stopping.Store(true)
	h.cancel()
	if h.ctr != nil {
		d.destroyContainer(h)
	}
	if h.proc != nil {
		if err := h.proc.Kill(); err != nil {
			h.logger.Error("destroying the supervisor", "error", err)
		}
	}
	d.tasks.Delete(taskID)
	return nil
}

func (d *Driver) InspectTask(taskID string) (*drivers.TaskStatus, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	return h.TaskStatus(), nil
}

func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *drivers.TaskResourceUsage, error) {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	h.clientAttached()
	if h.ctr != nil {
		return d.containerStats(ctx, h, interval)
	}
	if h.proc != nil {
		return procStats(ctx, h, interval)
	}
	// A remote endpoint uses no local resources; report zeros so the
	// client's stats collection keeps working.
	ch := make(chan *drivers.TaskResourceUsage)
	go func() {
		defer close(ch)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-h.doneCh:
				return
			case now := <-t.C:
				select {
				case ch <- &drivers.TaskResourceUsage{Timestamp: now.UnixNano(), ResourceUsage: &drivers.ResourceUsage{
					MemoryStats: &drivers.MemoryStats{}, CpuStats: &drivers.CpuStats{}}}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, nil
}

func (d *Driver) SignalTask(taskID string, signal string) error {
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.ctr != nil {
		return d.signalContainer(h, signal)
	}
	if h.proc == nil {
		return ErrNoProcess
	}
	sig := unix.SignalNum(strings.ToUpper(signal))
	if sig == 0 {
		return fmt.Errorf("unknown signal %q", signal)
	}
	return h.proc.Signal(sig)
}

func (d *Driver) ExecTask(taskID string, cmd []string, timeout time.Duration) (*drivers.ExecTaskResult, error) {
	if len(cmd) == 0 {
		return nil, errors.New("exec: command must have at least one element")
	}
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if h.ctr != nil {
		return nil, ErrContainerExec
	}
	if h.proc == nil {
		return nil, ErrNoProcess
	}
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	out, code, err := h.proc.Exec(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return &drivers.ExecTaskResult{Stdout: out, ExitResult: &drivers.ExitResult{ExitCode: code}}, nil
}

var _ drivers.ExecTaskStreamingDriver = (*Driver)(nil)

// ExecTaskStreaming serves `nomad alloc exec` through the engine's
// supervisor.
func (d *Driver) ExecTaskStreaming(ctx context.Context, taskID string, opts *drivers.ExecOptions) (*drivers.ExitResult, error) {
	if len(opts.Command) == 0 {
		return nil, errors.New("exec: command must have at least one element")
	}
	h, ok := d.tasks.Get(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if h.ctr != nil {
		return nil, ErrContainerExec
	}
	if h.proc == nil {
		return nil, ErrNoProcess
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resize := make(chan supervisor.TermSize, 1)
	go func() {
		defer close(resize)
		for {
			select {
			case <-ctx.Done():
				return
			case ts, ok := <-opts.ResizeCh:
				if !ok {
					return
				}
				select {
				case resize <- supervisor.TermSize{Height: ts.Height, Width: ts.Width}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	code, err := h.proc.ExecStreaming(ctx, opts.Command, opts.Tty, opts.Stdin, opts.Stdout, opts.Stderr, resize)
	if err != nil {
		return nil, err
	}
	return &drivers.ExitResult{ExitCode: code}, nil
}

// displayUser names the account an engine runs as in task events.
func displayUser(u string) string {
	if u != "" {
		return u
	}
	if cur, err := user.Current(); err == nil {
		return cur.Username
	}
	return strconv.Itoa(os.Geteuid())
}

// redact hides the values of secret-looking flags (--api-key, --hf-token,
// --ssl-keyfile, passwords) so task events and logs never carry them. A flag
// is secret when a word of its name (split at - and _) is or ends in key,
// token, secret, password or passwd; "tokens" (a count, as in
// --max-num-batched-tokens) is not, nor is anything after "per" (a rate, as
// in --step-time-per-prefill-token).
func redact(argv []string) []string {
	out := slices.Clone(argv)
	secret := func(flag string) bool {
		if !strings.HasPrefix(flag, "-") {
			return false
		}
		words := strings.FieldsFunc(strings.ToLower(flag), func(r rune) bool { return r == '-' || r == '_' })
		for _, w := range words {
			if w == "per" {
				return false
			}
			for _, s := range []string{"key", "keyfile", "token", "secret", "password", "passwd"} {
				if strings.HasSuffix(w, s) {
					return true
				}
			}
		}
		return false
	}
	for i := 0; i < len(out); i++ {
		if name, _, ok := strings.Cut(out[i], "="); ok && secret(name) {
			out[i] = name + "=<redacted>"
		} else if secret(out[i]) && i+1 < len(out) && !strings.HasPrefix(out[i+1], "-") {
			out[i+1] = "<redacted>"
			i++
		}
	}
	return out
}
