//go:build linux

package supervisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// child is a process started by spawn; done closes once it is reaped.
type child struct {
	cmd   *exec.Cmd
	pid   int
	start uint64
	done  chan struct{}
	exit  ProcessState
}

// spawn starts cmd in network namespace netns ("" = the supervisor's) and
// reaps it, both on one goroutine locked to its OS thread and never
// unlocked:
//   - setns(CLONE_NEWNET) changes only the calling thread, and the fork
//     inherits that thread's namespace; the thread is never handed back to
//     other goroutines, and Go ends it when the goroutine returns;
//   - Pdeathsig fires when the thread that forked the child ends, not the
//     process: the thread lives until the child is reaped.
func spawn(cmd *exec.Cmd, netns string) (*child, error) {
	c := &child{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer close(c.done)
		if err := enterNetNS(netns); err != nil {
			started <- err
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		c.pid = cmd.Process.Pid
		c.start = startTicks(c.pid)
		started <- nil
		c.exit = exitOf(c.pid, cmd.Wait())
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return c, nil
}

func enterNetNS(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering network namespace %s: %w", path, err)
	}
	return nil
}

// exitOf turns Wait's result into a ProcessState; a signal's exit code is
// 128+signal, as a shell reports it.
func exitOf(pid int, err error) ProcessState {
	ps := ProcessState{Pid: pid, Time: time.Now()}
	if err == nil {
		return ps
	}
	ps.ExitCode = 1
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			ps.ExitCode = ws.ExitStatus()
			if ws.Signaled() {
				ps.Signal = int(ws.Signal())
				ps.ExitCode = 128 + ps.Signal
			}
		}
	}
	return ps
}

// credential is the account name or uid's credential with its groups; nil
// when no switch is needed (no user, or the supervisor's own).
func credential(name string) (*syscall.Credential, error) {
	if name == "" {
		return nil, nil
	}
	var u *user.User
	var err error
	if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
		u, err = user.LookupId(name)
	} else {
		u, err = user.Lookup(name)
	}
	if err != nil {
		return nil, &FieldError{Field: "user", Msg: fmt.Sprintf("looking up %q: %v", name, err)}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, &FieldError{Field: "user", Msg: fmt.Sprintf("account %q has no numeric uid/gid: %v", name, err)}
	}
	if int(uid) == os.Geteuid() && int(gid) == os.Getegid() && uid != 0 {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		return nil, &FieldError{Field: "user", Msg: fmt.Sprintf("running as %q needs root (the supervisor runs as uid %d)", name, os.Geteuid())}
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	gids, err := u.GroupIds()
	if err != nil {
		return nil, &FieldError{Field: "user", Msg: fmt.Sprintf("listing the groups of %q: %v", name, err)}
	}
	for _, g := range gids {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			cred.Groups = append(cred.Groups, uint32(n))
		}
	}
	return cred, nil
}

// openOutput opens where the engine's stdout or stderr goes: a FIFO (the
// open blocks until its reader, Nomad's logmon, has it open) or a file.
func openOutput(field, path string) (*os.File, error) {
	if path == "" {
		path = os.DevNull
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, &FieldError{Field: field, Msg: err.Error()}
	}
	return f, nil
}

// engineCmd builds the engine's command: its own process group, killed
// with the supervisor (Pdeathsig), as the task's user.
func engineCmd(c Command, cred *syscall.Credential, stdout, stderr *os.File) *exec.Cmd {
	env := c.Env
	if env == nil {
		env = []string{} // nil would inherit the supervisor's environment
	}
	cmd := &exec.Cmd{
		Path:   c.Path,
		Args:   append([]string{c.Path}, c.Args...),
		Env:    env,
		Dir:    c.Dir,
		Stdout: stdout,
		Stderr: stderr,
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:    true,
			Pdeathsig:  syscall.SIGKILL,
			Credential: cred,
		},
	}
	return cmd
}

// defaultPath is where exec commands are looked up when the task's
// environment sets no PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// lookPath resolves an exec's program in the task's PATH (not the
// supervisor's), as a shell in the task would.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in the task's PATH %q", name, path)
}

// signalNum parses "SIGINT", "sigint" or "INT".
func signalNum(name string) (syscall.Signal, error) {
	n := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	if s := unix.SignalNum(n); s != 0 {
		return s, nil
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownSignal, name)
}
