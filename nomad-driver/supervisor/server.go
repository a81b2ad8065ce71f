//go:build linux

package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/oasis-llm/oasis/nomad-driver/supervisor/internal/wire"
)

// Supervisor-side bounds.
const (
	maxLaunchRequest = 4 << 20
	// killWait bounds waiting for SIGKILLed processes to be gone.
	killWait = 15 * time.Second
	// prefaceTimeout bounds a new connection's first byte.
	prefaceTimeout = 10 * time.Second
)

// Main runs the supervisor when os.Args select it ("<binary> supervisor
// [<log file>]", as Launch starts it) and then exits the process;
// otherwise it returns false at once. Call it first in main, before
// anything reads os.Args or writes to stdout.
func Main() bool {
	if len(os.Args) < 2 || len(os.Args) > 3 || os.Args[1] != ModeArg {
		return false
	}
	os.Exit(runSupervisor(os.NewFile(3, "launch-request"), os.NewFile(4, "launch-reply")))
	return true
}

// server is the supervisor process's state.
type server struct {
	logger hclog.Logger
	cmd    Command
	cred   *syscall.Credential
	engine *child
	mhz    float64
	// quit is closed (once) by Kill.
	quit     chan struct{}
	quitOnce sync.Once
}

// runSupervisor is the supervisor process: it starts the engine, answers
// the launching client on reply, and serves the socket until Kill or a
// SIGTERM/SIGINT. Its return value is the process's exit code.
func runSupervisor(reqFile, reply *os.File) int {
	// Keep the main thread to the main goroutine: spawn's goroutines,
	// which enter network namespaces and end their threads, never get it
	// (Go cannot end the main thread; it would stay in the namespace).
	runtime.LockOSThread()
	logger := hclog.New(&hclog.LoggerOptions{Name: "supervisor", Output: os.Stderr, Level: hclog.Info})
	answer := func(r wire.LaunchReply) {
		if err := json.NewEncoder(reply).Encode(r); err != nil {
			logger.Error("answering the launching client", "error", err)
		}
		reply.Close()
	}
	var req wire.LaunchRequest
	err := json.NewDecoder(io.LimitReader(reqFile, maxLaunchRequest)).Decode(&req)
	reqFile.Close()
	if err != nil {
		answer(wire.LaunchReply{Error: "reading launch request: " + err.Error()})
		return 2
	}
	if lvl := hclog.LevelFromString(req.LogLevel); lvl != hclog.NoLevel {
		logger.SetLevel(lvl)
	}
	s := &server{logger: logger, quit: make(chan struct{}), mhz: coreMHz(),
		cmd: Command{Path: req.Path, Args: req.Args, Env: req.Env, Dir: req.Dir, User: req.User,
			StdoutPath: req.StdoutPath, StderrPath: req.StderrPath, NetNS: req.NetNS}}
	ln, err := s.start(req.Socket)
	if err != nil {
		r := wire.LaunchReply{Error: err.Error()}
		var fe *FieldError
		if errors.As(err, &fe) {
			r.Field, r.Error = fe.Field, fe.Msg
		}
		answer(r)
		return 1
	}
	answer(wire.LaunchReply{Pid: s.engine.pid, Start: s.engine.start})
	logger.Info("engine started", "pid", s.engine.pid, "path", s.cmd.Path, "socket", req.Socket)
	return s.serve(ln)
}

// start validates the command, listens on the socket and starts the engine.
func (s *server) start(socket string) (*net.UnixListener, error) {
	if err := s.cmd.Validate(); err != nil {
		return nil, err
	}
	cred, err := credential(s.cmd.User)
	if err != nil {
		return nil, err
	}
	s.cred = cred
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting %s: %w", socket, err)
	}
	stdout, err := openOutput("stdout_path", s.cmd.StdoutPath)
	if err != nil {
		ln.Close()
		return nil, err
	}
	defer stdout.Close()
	stderr, err := openOutput("stderr_path", s.cmd.StderrPath)
	if err != nil {
		ln.Close()
		return nil, err
	}
	defer stderr.Close()
	s.engine, err = spawn(engineCmd(s.cmd, cred, stdout, stderr), s.cmd.NetNS)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("starting %s: %w", s.cmd.Path, err)
	}
	return ln, nil
}

// serve answers clients until Kill or a termination signal.
func (s *server) serve(ln *net.UnixListener) int {
	rpcs := rpc.NewServer()
	if err := rpcs.RegisterName("Supervisor", &service{s: s}); err != nil {
		s.logger.Error("registering the RPC service", "error", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	// Handlers, not Ignore: ignored dispositions would pass to the engine.
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go s.accept(ln, rpcs)
	go func() {
		<-s.engine.done
		s.logger.Info("engine exited", "pid", s.engine.pid, "exit_code", s.engine.exit.ExitCode, "signal", s.engine.exit.Signal)
	}()
	for {
		select {
		case <-s.quit:
			ln.Close() // removes the socket
			s.logger.Info("killed by a client; exiting")
			return 0
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				s.logger.Info("ignoring SIGHUP")
				continue
			}
			s.logger.Warn("terminated by signal: killing the engine", "signal", sig)
			ln.Close()
			if err := s.shutdown("", 0); err != nil {
				s.logger.Error("killing the engine", "error", err)
				return 1
			}
			return 0
		}
	}
}

func (s *server) accept(ln *net.UnixListener, rpcs *rpc.Server) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.logger.Error("accepting", "error", err)
			}
			return
		}
		go s.serveConn(c, rpcs)
	}
}

// serveConn checks the peer (root or the supervisor's own user) and
// dispatches on the connection's first byte.
func (s *server) serveConn(c *net.UnixConn, rpcs *rpc.Server) {
	if uid, err := peerUID(c); err != nil || (uid != 0 && int(uid) != os.Geteuid()) {
		s.logger.Warn("refusing a client", "uid", uid, "error", err)
		c.Close()
		return
	}
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(3*4))
	_ = c.SetReadDeadline(time.Now().Add(prefaceTimeout))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil || n != 1 {
		c.Close()
		return
	}
	files, ferr := receivedFiles(oob[:oobn])
	switch {
	case buf[0] == wire.PrefaceRPC && len(files) == 0 && ferr == nil:
		rpcs.ServeConn(c)
	case buf[0] == wire.PrefaceExec && ferr == nil:
		s.serveExec(c, files)
	default:
		closeAll(files)
		c.Close()
	}
}

func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

func receivedFiles(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "received"))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// exited reports whether the engine has been reaped.
func (s *server) exited() bool {
	select {
	case <-s.engine.done:
		return true
	default:
		return false
	}
}

// shutdown is Nomad's executor shutdown: with a grace period, signal
// (default SIGINT) to the engine's process group and up to grace for the
// engine to exit; then SIGKILL to every process left in the group.
func (s *server) shutdown(sigName string, grace time.Duration) error {
	if grace > 0 {
		if sigName == "" {
			sigName = "SIGINT"
		}
		sig, err := signalNum(sigName)
		if err != nil {
			return err
		}
		if !s.exited() {
			if err := syscall.Kill(-s.engine.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("signalling process group %d: %w", s.engine.pid, err)
			}
		}
		t := time.NewTimer(grace)
		select {
		case <-s.engine.done:
		case <-t.C:
			s.logger.Info("engine outlived its grace period: killing its process group", "grace", grace)
		}
		t.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), killWait)
	defer cancel()
	err := killGroup(ctx, s.engine.pid, s.engine.start)
	select {
	case <-s.engine.done:
	case <-ctx.Done():
		return fmt.Errorf("engine (pid %d) did not exit within %s of SIGKILL", s.engine.pid, killWait)
	}
	return err
}
