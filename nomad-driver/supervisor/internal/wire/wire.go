// Package wire holds the messages between a supervisor and its clients:
// net/rpc (gob) arguments and replies, and the JSON of the launch pipe and
// of exec connections. Both ends are the same binary's supervisor package,
// so the messages carry no version of their own beyond Hello's.
package wire

import "time"

// Version is the protocol version Hello reports; a client refuses another.
const Version = 1

// Connection prefaces: the first byte a client writes on a new connection.
const (
	PrefaceRPC  byte = 'R' // net/rpc follows
	PrefaceExec byte = 'X' // carries the exec's file descriptors; an ExecRequest follows
)

// MaxExecRequest bounds an exec connection's request (length-prefixed JSON).
const MaxExecRequest = 2 << 20

// Empty is an RPC argument or reply without content.
type Empty struct{}

// Hello identifies the supervisor at the other end of a socket.
type Hello struct {
	Version     int
	Pid         int
	EnginePid   int
	EngineStart uint64
	Exited      bool
}

// Exit is the engine's end (supervisor.ProcessState).
type Exit struct {
	Pid, ExitCode, Signal int
	Time                  time.Time
}

// ShutdownArgs are Supervisor.Shutdown's arguments.
type ShutdownArgs struct {
	Signal string
	Grace  time.Duration
}

// Sample is one reading of the engine's process tree.
type Sample struct {
	Time                   time.Time
	UserTicks, SystemTicks uint64 // clock ticks (USER_HZ)
	RSS, Swap              uint64 // bytes
	Pids                   int
	CoreMHz                float64 // mean MHz of one CPU
}

// LaunchRequest is what the client writes to a new supervisor (fd 3).
type LaunchRequest struct {
	Path, Dir, User, StdoutPath, StderrPath, NetNS string
	Args, Env                                      []string
	Socket                                         string
	LogLevel                                       string
}

// LaunchReply is what the supervisor answers on fd 4 once the engine is
// started (or could not be).
type LaunchReply struct {
	Pid   int    `json:",omitempty"`
	Start uint64 `json:",omitempty"`
	Error string `json:",omitempty"`
	// Field is set when Error is a validation error of that field.
	Field string `json:",omitempty"`
}

// ExecRequest follows an exec connection's preface.
type ExecRequest struct {
	Cmd []string
	TTY bool
}

// ExecReply ends an exec connection.
type ExecReply struct {
	ExitCode int
	Error    string `json:",omitempty"`
}
