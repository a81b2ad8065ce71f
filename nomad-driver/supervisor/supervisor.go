//go:build linux

package supervisor

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ModeArg is os.Args[1] of a supervisor process (see Main).
const ModeArg = "supervisor"

// Bounds on a Command (it comes from a job's task config).
const (
	MaxArgs     = 4096
	MaxEnv      = 4096
	MaxArgBytes = 128 << 10 // one argument or one environment entry
	MaxCmdBytes = 1 << 20   // all arguments and environment entries together
	MaxPathLen  = 4096      // Path, Dir, StdoutPath, StderrPath, NetNS
	MaxUserLen  = 256
)

// Command is what the supervisor starts: the engine.
type Command struct {
	Path string
	Args []string
	Env  []string
	Dir  string
	// User is an account name or a numeric uid; "" runs as the driver's
	// user. The account's primary and supplementary groups apply.
	User string
	// StdoutPath and StderrPath are FIFOs (or files, created if missing)
	// the engine's output goes to; "" is /dev/null.
	StdoutPath, StderrPath string
	// NetNS is a network namespace path entered before exec; "" = host.
	NetNS string
}

// Config configures Launch and Reattach.
type Config struct {
	// Logger logs the client side; nil: hclog.NewNullLogger().
	Logger hclog.Logger
	// Binary is the executable whose main calls Main (default: os.Executable()).
	Binary string
	// LogFile is where the supervisor process logs (the driver passes
	// <task dir>/supervisor.log); "" discards its log.
	LogFile string
	// SocketDir holds the supervisors' sockets (default: DefaultSocketDir()).
	// It is created 0700 and must be owned by this user, mode 0700.
	SocketDir string
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return c
}

// State is everything Reattach needs; the driver msgpack-encodes it into
// Nomad's task handle.
type State struct {
	// Socket is the supervisor's unix socket.
	Socket string `codec:"socket"`
	// SupervisorPid and SupervisorStart (clock ticks after boot, from
	// /proc/PID/stat) identify the supervisor process across pid reuse.
	SupervisorPid   int    `codec:"supervisor_pid"`
	SupervisorStart uint64 `codec:"supervisor_start"`
	// EnginePid is the engine's pid and process group; EngineStart its
	// start time in clock ticks: Destroy kills only processes of that group
	// started no earlier.
	EnginePid   int    `codec:"engine_pid"`
	EngineStart uint64 `codec:"engine_start"`
	LogFile     string `codec:"log_file"`
}

// ProcessState is how the engine ended. ExitCode is 128+Signal when a
// signal ended it (as a shell reports it).
type ProcessState struct {
	Pid      int
	ExitCode int
	Signal   int
	Time     time.Time
}

// Usage is one resource sample of the engine's process tree (the engine,
// its descendants, and the members of its process group).
type Usage struct {
	Timestamp time.Time
	// RSS and Swap in bytes.
	RSS, Swap uint64
	// Percent, UserMode and SystemMode are CPU percentages (100 = one core)
	// over the interval since the previous sample; TotalTicks is Percent
	// in MHz of the node's total (Nomad's TaskResourceUsage.CpuStats).
	Percent, UserMode, SystemMode, TotalTicks float64
	// Measured names the fields measured, in Nomad's words: the memory
	// ones (MemoryMeasured) and the CPU ones (CPUMeasured).
	Measured []string
}

// Nomad's names of the measured statistics.
var (
	memoryMeasured = []string{"RSS", "Swap"}
	cpuMeasured    = []string{"System Mode", "User Mode", "Percent"}
)

// MemoryMeasured is Nomad's MemoryStats.Measured for a Usage.
func (u *Usage) MemoryMeasured() []string { return filterMeasured(u.Measured, memoryMeasured) }

// CPUMeasured is Nomad's CpuStats.Measured for a Usage.
func (u *Usage) CPUMeasured() []string { return filterMeasured(u.Measured, cpuMeasured) }

func filterMeasured(have, kind []string) []string {
	var out []string
	for _, m := range have {
		for _, k := range kind {
			if m == k {
				out = append(out, m)
			}
		}
	}
	return out
}

// TermSize is a terminal size for ExecStreaming with a TTY.
type TermSize struct{ Height, Width int }

// Errors.
var (
	// ErrInvalidCommand is matched (errors.Is) by every *FieldError.
	ErrInvalidCommand = errors.New("invalid supervisor command")
	// ErrUnreachable: the supervisor's socket does not answer (see *ConnectError).
	ErrUnreachable = errors.New("supervisor unreachable")
	// ErrUnknownSignal: Shutdown or a signal name that Linux does not have.
	ErrUnknownSignal = errors.New("unknown signal")
)

// FieldError is a Command or exec argument refused by validation; Field
// names it as the task config's reader knows it ("args[3]", "env[0]", "user").
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Is makes every FieldError match ErrInvalidCommand.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidCommand }

// ConnectError is a supervisor whose socket cannot be reached.
type ConnectError struct {
	Socket string
	Pid    int
	Err    error
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("connecting to supervisor (pid %d) at %s: %v", e.Pid, e.Socket, e.Err)
}

func (e *ConnectError) Unwrap() []error { return []error{ErrUnreachable, e.Err} }

// Validate checks a Command before it is started: absolute paths, no NUL
// bytes, bounded sizes. Errors are *FieldError naming the field.
func (c Command) Validate() error {
	if err := checkPath("path", c.Path, true); err != nil {
		return err
	}
	for _, p := range []struct{ field, v string }{
		{"dir", c.Dir}, {"stdout_path", c.StdoutPath}, {"stderr_path", c.StderrPath}, {"netns", c.NetNS},
	} {
		if err := checkPath(p.field, p.v, false); err != nil {
			return err
		}
	}
	if len(c.User) > MaxUserLen || strings.ContainsAny(c.User, "\x00:/\n") {
		return &FieldError{Field: "user", Msg: fmt.Sprintf("must be an account name or uid of at most %d bytes without NUL, ':', '/' or newline", MaxUserLen)}
	}
	total := len(c.Path)
	if err := checkList("args", c.Args, MaxArgs, &total, false); err != nil {
		return err
	}
	return checkList("env", c.Env, MaxEnv, &total, true)
}

// checkArgv validates an exec command line.
func checkArgv(cmd []string) error {
	if len(cmd) == 0 || cmd[0] == "" {
		return &FieldError{Field: "command", Msg: "must have at least one element, the program"}
	}
	total := 0
	return checkList("command", cmd, MaxArgs, &total, false)
}

func checkPath(field, v string, required bool) error {
	switch {
	case v == "" && required:
		return &FieldError{Field: field, Msg: "must be set"}
	case v == "":
		return nil
	case len(v) > MaxPathLen:
		return &FieldError{Field: field, Msg: fmt.Sprintf("longer than %d bytes", MaxPathLen)}
	case strings.IndexByte(v, 0) >= 0:
		return &FieldError{Field: field, Msg: "contains a NUL byte"}
	case !filepath.IsAbs(v):
		return &FieldError{Field: field, Msg: fmt.Sprintf("%q is not an absolute path", v)}
	}
	return nil
}

func checkList(field string, vs []string, maxN int, total *int, env bool) error {
	if len(vs) > maxN {
		return &FieldError{Field: field, Msg: fmt.Sprintf("%d entries, more than %d", len(vs), maxN)}
	}
	for i, v := range vs {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case len(v) > MaxArgBytes:
			return &FieldError{Field: f, Msg: fmt.Sprintf("longer than %d bytes", MaxArgBytes)}
		case strings.IndexByte(v, 0) >= 0:
			return &FieldError{Field: f, Msg: "contains a NUL byte"}
		case env && strings.IndexByte(v, '=') <= 0:
			return &FieldError{Field: f, Msg: "must be NAME=value with a non-empty NAME"}
		}
		*total += len(v)
		if *total > MaxCmdBytes {
			return &FieldError{Field: field, Msg: fmt.Sprintf("arguments and environment exceed %d bytes", MaxCmdBytes)}
		}
	}
	return nil
}
