//go:build linux

package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/nomad-driver/supervisor/internal/wire"
)

// maxSocketPath is the longest unix socket path Linux accepts (sun_path
// is 108 bytes with the terminating NUL).
const maxSocketPath = 107

// killTimeout bounds Kill: the supervisor's SIGKILL of the engine group and
// its own exit.
const killTimeout = 30 * time.Second

// Handle is a client of one supervisor.
type Handle struct {
	logger hclog.Logger
	state  State
	rpc    *rpc.Client
	// reaped is closed once the supervisor process, when this Handle
	// launched it (it is then this process's child), has been reaped; nil
	// after Reattach.
	reaped chan struct{}
}

// DefaultSocketDir is where supervisors' sockets live: /run/oasis-supervisor
// for root, else oasis-supervisor-<uid> in the temporary directory. Both
// are short: a unix socket path has at most 107 bytes, and Nomad's task
// directories are longer than that in places.
func DefaultSocketDir() string {
	if os.Geteuid() == 0 {
		return "/run/oasis-supervisor"
	}
	return filepath.Join(os.TempDir(), "oasis-supervisor-"+strconv.Itoa(os.Geteuid()))
}

// ensureSocketDir creates dir 0700 or checks that it is a directory (not a
// link) of this user with mode 0700: nobody else may reach the sockets.
func ensureSocketDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("socket directory %q is not an absolute path", dir)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating socket directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("checking socket directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("socket directory %s is not a directory", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("socket directory %s is not owned by uid %d", dir, os.Geteuid())
	case fi.Mode().Perm() != 0o700:
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("restricting socket directory %s to 0700: %w", dir, err)
		}
	}
	return nil
}

func newSocketPath(dir string) (string, error) {
	if dir == "" {
		dir = DefaultSocketDir()
	}
	if err := ensureSocketDir(dir); err != nil {
		return "", err
	}
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	p := filepath.Join(dir, hex.EncodeToString(b[:])+".sock")
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("socket path %s is %d bytes, more than the %d a unix socket may have: choose a shorter SocketDir", p, len(p), maxSocketPath)
	}
	return p, nil
}

// Launch starts a supervisor (a detached re-execution of cfg.Binary in its
// own session) that starts cmd, and returns a Handle connected to it once
// the engine has started. ctx bounds the launch only.
func Launch(ctx context.Context, cfg Config, cmd Command) (*Handle, error) {
	cfg = cfg.withDefaults()
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	bin := cfg.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("finding the supervisor binary: %w", err)
		}
	}
	socket, err := newSocketPath(cfg.SocketDir)
	if err != nil {
		return nil, err
	}
	proc, reply, err := startSupervisor(ctx, cfg, bin, wire.LaunchRequest{
		Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, User: cmd.User,
		StdoutPath: cmd.StdoutPath, StderrPath: cmd.StderrPath, NetNS: cmd.NetNS,
		Socket: socket, LogLevel: logLevel(cfg.Logger),
	})
	if err != nil {
		return nil, err
	}
	h := &Handle{logger: cfg.Logger, reaped: make(chan struct{}), state: State{
		Socket: socket, SupervisorPid: proc.Process.Pid, SupervisorStart: startTicks(proc.Process.Pid),
		EnginePid: reply.Pid, EngineStart: reply.Start, LogFile: cfg.LogFile,
	}}
	go func() { _ = proc.Wait(); close(h.reaped) }()
	if h.rpc, err = h.connect(ctx); err != nil {
		dctx, cancel := context.WithTimeout(context.Background(), killTimeout)
		defer cancel()
		return nil, errors.Join(err, Destroy(dctx, h.state))
	}
	cfg.Logger.Debug("supervisor launched", "pid", h.state.SupervisorPid, "engine_pid", reply.Pid, "socket", socket)
	return h, nil
}

func logLevel(l hclog.Logger) string {
	if l.IsDebug() || l.IsTrace() {
		return "debug"
	}
	return "info"
}

// startSupervisor starts the supervisor process, sends it the request on
// its fd 3 and reads its answer from its fd 4.
func startSupervisor(ctx context.Context, cfg Config, bin string, req wire.LaunchRequest) (*exec.Cmd, wire.LaunchReply, error) {
	var reply wire.LaunchReply
	logPath := cfg.LogFile
	if logPath == "" {
		logPath = os.DevNull
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, reply, fmt.Errorf("opening the supervisor's log file: %w", err)
	}
	defer logf.Close()
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, reply, err
	}
	defer reqW.Close()
	repR, repW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		return nil, reply, err
	}
	defer repR.Close()
	// The log file (in the task directory) on the command line says in ps
	// which task a supervisor serves, as Nomad's executor's did.
	args := []string{bin, ModeArg}
	if cfg.LogFile != "" {
		args = append(args, cfg.LogFile)
	}
	c := &exec.Cmd{Path: bin, Args: args, Dir: "/", Env: supervisorEnv(os.Environ()), Stdout: logf, Stderr: logf,
		ExtraFiles: []*os.File{reqR, repW}, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	err = c.Start()
	reqR.Close()
	repW.Close()
	if err != nil {
		return nil, reply, fmt.Errorf("starting supervisor %s: %w", bin, err)
	}
	go func() { _ = json.NewEncoder(reqW).Encode(req); reqW.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = repR.SetReadDeadline(time.Now()) })
	err = json.NewDecoder(io.LimitReader(repR, 1<<20)).Decode(&reply)
	stop()
	switch {
	case err != nil && ctx.Err() != nil:
		err = fmt.Errorf("waiting for the supervisor to start the engine: %w", ctx.Err())
	case err != nil:
		err = fmt.Errorf("reading the supervisor's answer (its log: %s): %w", logPath, err)
	case reply.Field != "":
		err = &FieldError{Field: reply.Field, Msg: reply.Error}
	case reply.Error != "":
		err = errors.New(reply.Error)
	}
	if err != nil {
		_ = c.Process.Kill()
		_ = c.Wait()
		_ = os.Remove(req.Socket) // a SIGKILLed listener leaves its file
		return nil, reply, err
	}
	return c, reply, nil
}

// supervisorEnvKeep are the driver's environment variables a supervisor
// gets: those of Go's runtime and tools. The rest (the Nomad client's and
// go-plugin's, tokens an operator set) it has no use for; the engine gets
// exactly Command.Env.
var supervisorEnvKeep = []string{"PATH", "TMPDIR", "TZ", "GODEBUG", "GOTRACEBACK", "GOMAXPROCS",
	"GOMEMLIMIT", "GOGC", "GORACE", "GOCOVERDIR"}

func supervisorEnv(env []string) []string {
	out := []string{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(supervisorEnvKeep, k) {
			out = append(out, kv)
		}
	}
	return out
}

// Reattach connects to the supervisor of st, as the driver does in
// RecoverTask after it restarted. A supervisor that is gone or does not
// answer is a *ConnectError (errors.Is ErrUnreachable); Destroy then
// removes what is left of the engine.
func Reattach(ctx context.Context, cfg Config, st State) (*Handle, error) {
	cfg = cfg.withDefaults()
	if st.Socket == "" || st.SupervisorPid <= 0 {
		return nil, fmt.Errorf("reattaching: state names no supervisor (socket %q, pid %d)", st.Socket, st.SupervisorPid)
	}
	h := &Handle{logger: cfg.Logger, state: st}
	if !running(st.SupervisorPid, st.SupervisorStart) {
		return nil, &ConnectError{Socket: st.Socket, Pid: st.SupervisorPid, Err: errors.New("the supervisor process is gone")}
	}
	var err error
	if h.rpc, err = h.connect(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// connect dials the RPC connection and checks that the supervisor at the
// socket is the one of the state.
func (h *Handle) connect(ctx context.Context) (*rpc.Client, error) {
	conn, err := h.dialRaw(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte{wire.PrefaceRPC}); err != nil {
		conn.Close()
		return nil, &ConnectError{Socket: h.state.Socket, Pid: h.state.SupervisorPid, Err: err}
	}
	c := rpc.NewClient(conn)
	var hello wire.Hello
	err = callOn(ctx, c, "Supervisor.Hello", wire.Empty{}, &hello)
	switch {
	case err != nil:
	case hello.Version != wire.Version:
		err = fmt.Errorf("protocol version %d, this client speaks %d", hello.Version, wire.Version)
	case hello.Pid != h.state.SupervisorPid || hello.EnginePid != h.state.EnginePid:
		err = fmt.Errorf("the socket is served by pid %d (engine %d), the state names pid %d (engine %d)",
			hello.Pid, hello.EnginePid, h.state.SupervisorPid, h.state.EnginePid)
	}
	if err != nil {
		c.Close()
		return nil, &ConnectError{Socket: h.state.Socket, Pid: h.state.SupervisorPid, Err: err}
	}
	return c, nil
}

func (h *Handle) dialRaw(ctx context.Context) (*net.UnixConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", h.state.Socket)
	if err != nil {
		return nil, &ConnectError{Socket: h.state.Socket, Pid: h.state.SupervisorPid, Err: err}
	}
	return c.(*net.UnixConn), nil
}

// call makes an RPC on the Handle's connection, bounded by ctx.
func (h *Handle) call(ctx context.Context, method string, args, reply any) error {
	return callOn(ctx, h.rpc, method, args, reply)
}

func callOn(ctx context.Context, c *rpc.Client, method string, args, reply any) error {
	call := c.Go(method, args, reply, make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
		if call.Error != nil && call.Error.Error() == errEngineExited {
			return ErrEngineExited
		}
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

// State is what Reattach needs to reach this supervisor again.
func (h *Handle) State() State { return h.state }

// Pid is the engine's pid.
func (h *Handle) Pid() int { return h.state.EnginePid }

// Wait blocks until the engine has exited (or ctx ends) and returns how;
// the supervisor keeps the answer for every Wait until Kill.
func (h *Handle) Wait(ctx context.Context) (*ProcessState, error) {
	var e wire.Exit
	if err := h.call(ctx, "Supervisor.Wait", wire.Empty{}, &e); err != nil {
		return nil, fmt.Errorf("waiting on engine (pid %d): %w", h.state.EnginePid, err)
	}
	return &ProcessState{Pid: e.Pid, ExitCode: e.ExitCode, Signal: e.Signal, Time: e.Time}, nil
}

// Signal sends sig to the engine process; ErrEngineExited once it exited.
func (h *Handle) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.call(ctx, "Supervisor.Signal", int(sig), &wire.Empty{})
}

// Shutdown stops the engine as Nomad's executor does: when grace > 0 it
// sends signal (default SIGINT) to the engine's process group and waits up
// to grace for the engine to exit; then it SIGKILLs every process left in
// the group. It returns once the engine has exited, or when ctx ends (the
// supervisor then finishes the shutdown on its own).
func (h *Handle) Shutdown(ctx context.Context, signal string, grace time.Duration) error {
	if grace > 0 && signal != "" {
		if _, err := signalNum(signal); err != nil {
			return err
		}
	}
	return h.call(ctx, "Supervisor.Shutdown", wire.ShutdownArgs{Signal: signal, Grace: grace}, &wire.Empty{})
}

// Close drops the connection; the supervisor and the engine keep running
// (the driver is shutting down). A Handle launched by this process keeps
// reaping its supervisor child should it end.
func (h *Handle) Close() error { return h.rpc.Close() }

// Kill ends the supervisor and everything left of the engine's process
// group, whether or not the supervisor still answers, and returns once
// none of them is left (or with the error saying what is). It works on a
// Closed Handle too (it connects again). Calls in flight on the Handle
// (a Wait) get their answers if the supervisor sends them before it exits.
func (h *Handle) Kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	if err := h.killCall(ctx); err != nil {
		// Also when the supervisor exits before its answer is written;
		// Destroy checks what is left either way.
		h.logger.Debug("supervisor kill call", "error", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, killTimeout/2)
	defer wcancel()
	h.waitSupervisor(wctx)
	h.rpc.Close()
	return Destroy(ctx, h.state)
}

// killCall asks the supervisor to end, on the Handle's connection or, once
// that is closed, a new one.
func (h *Handle) killCall(ctx context.Context) error {
	err := h.call(ctx, "Supervisor.Kill", wire.Empty{}, &wire.Empty{})
	if !errors.Is(err, rpc.ErrShutdown) || !running(h.state.SupervisorPid, h.state.SupervisorStart) {
		return err
	}
	c, err := h.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return callOn(ctx, c, "Supervisor.Kill", wire.Empty{}, &wire.Empty{})
}

// waitSupervisor waits until the supervisor process is gone or ctx ends.
func (h *Handle) waitSupervisor(ctx context.Context) {
	if h.reaped != nil {
		select {
		case <-h.reaped:
		case <-ctx.Done():
		}
		return
	}
	_ = until(ctx, func() bool { return !running(h.state.SupervisorPid, h.state.SupervisorStart) })
}

// Destroy removes what is left of a supervisor and its engine without
// talking to it: it SIGKILLs the supervisor (if it is still the process
// of the state) and the members of the engine's process group started no
// earlier than the engine. It is what the driver calls when Reattach
// fails, so that no engine outlives a lost supervisor.
func Destroy(ctx context.Context, st State) error {
	if st.SupervisorPid > 0 {
		err := until(ctx, func() bool {
			if !running(st.SupervisorPid, st.SupervisorStart) {
				return true
			}
			_ = syscall.Kill(st.SupervisorPid, syscall.SIGKILL)
			return false
		})
		if err != nil {
			return fmt.Errorf("supervisor (pid %d) still running: %w", st.SupervisorPid, err)
		}
	}
	if st.EnginePid > 0 {
		if err := killGroup(ctx, st.EnginePid, st.EngineStart); err != nil {
			return err
		}
	}
	if st.Socket != "" {
		if err := os.Remove(st.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing socket: %w", err)
		}
	}
	return nil
}
