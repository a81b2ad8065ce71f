//go:build linux

package supervisor

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/oasis-llm/oasis/nomad-driver/supervisor/internal/wire"
)

// ExecOutputLimit bounds Exec's combined output: the last bytes are kept.
const ExecOutputLimit = 64 << 10

// execDrain bounds reading an exec's output after it exited: a background
// process it started may hold the pipes open.
const execDrain = time.Second

// Exec runs cmd in the engine's context (environment, working directory,
// user, network namespace) and returns its combined output (the last
// ExecOutputLimit bytes) and exit code. ctx carries the deadline: when it
// ends the command's process group is killed and ctx's error returned.
func (h *Handle) Exec(ctx context.Context, cmd []string) ([]byte, int, error) {
	buf := &tailBuffer{max: ExecOutputLimit}
	code, err := h.ExecStreaming(ctx, cmd, false, nil, buf, buf, nil)
	return buf.bytes(), code, err
}

// ExecStreaming runs cmd in the engine's context with its standard streams
// connected to stdin, stdout and stderr, or to a terminal (tty) whose size
// follows resize. The client makes the pipes or the pseudo-terminal and
// hands the command's ends to the supervisor over the socket (SCM_RIGHTS).
// When ctx ends the command's process group is killed.
func (h *Handle) ExecStreaming(ctx context.Context, cmd []string, tty bool, stdin io.Reader,
	stdout, stderr io.Writer, resize <-chan TermSize) (int, error) {
	if err := checkArgv(cmd); err != nil {
		return -1, err
	}
	ends, err := newExecEnds(tty)
	if err != nil {
		return -1, err
	}
	defer ends.close()
	ends.applyQueued(resize)
	conn, err := h.dialRaw(ctx)
	if err != nil {
		return -1, err
	}
	defer conn.Close()
	if err := sendExec(conn, cmd, tty, ends.remote); err != nil {
		return -1, fmt.Errorf("exec: sending the request to the supervisor: %w", err)
	}
	ends.closeRemote()
	wg := ends.copy(stdin, stdout, stderr, resize)
	res := make(chan error, 1)
	var reply wire.ExecReply
	go func() { res <- json.NewDecoder(io.LimitReader(conn, 1<<16)).Decode(&reply) }()
	select {
	case <-ctx.Done():
		conn.Close() // the supervisor kills the command's process group
		ends.drain(0)
		return -1, ctx.Err()
	case err := <-res:
		ends.drain(execDrain)
		wg.Wait()
		switch {
		case err != nil:
			return -1, fmt.Errorf("exec: reading the supervisor's reply: %w", err)
		case reply.Error != "":
			return -1, fmt.Errorf("exec %q: %s", cmd[0], reply.Error)
		}
		return reply.ExitCode, nil
	}
}

// execEnds are an exec's streams: the client's ends, and the remote ends
// (the command's stdin, stdout, stderr, or the terminal) sent to the
// supervisor.
type execEnds struct {
	master          *os.File // tty
	inW, outR, errR *os.File // pipes
	remote          []*os.File
	stop            chan struct{}
	stopOnce        sync.Once
}

func newExecEnds(tty bool) (*execEnds, error) {
	e := &execEnds{stop: make(chan struct{})}
	if tty {
		m, s, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("exec: opening a pseudo-terminal: %w", err)
		}
		e.master, e.remote = m, []*os.File{s}
		return e, nil
	}
	inR, inW, err1 := os.Pipe()
	outR, outW, err2 := os.Pipe()
	errR, errW, err3 := os.Pipe()
	e.inW, e.outR, e.errR = inW, outR, errR
	e.remote = []*os.File{inR, outW, errW}
	if err := errors.Join(err1, err2, err3); err != nil {
		e.close()
		return nil, fmt.Errorf("exec: making pipes: %w", err)
	}
	return e, nil
}

func (e *execEnds) closeRemote() {
	for _, f := range e.remote {
		if f != nil {
			f.Close()
		}
	}
}

func (e *execEnds) close() {
	e.stopOnce.Do(func() { close(e.stop) })
	e.closeRemote()
	for _, f := range []*os.File{e.master, e.inW, e.outR, e.errR} {
		if f != nil {
			f.Close()
		}
	}
}

// applyQueued applies the resizes already queued, so the command starts
// with the caller's terminal size.
func (e *execEnds) applyQueued(resize <-chan TermSize) {
	for e.master != nil {
		select {
		case sz, ok := <-resize:
			if !ok {
				return
			}
			setSize(e.master, sz)
		default:
			return
		}
	}
}

func setSize(f *os.File, sz TermSize) {
	if sz.Height > 0 && sz.Width > 0 && sz.Height <= 0xffff && sz.Width <= 0xffff {
		_ = pty.Setsize(f, &pty.Winsize{Rows: uint16(sz.Height), Cols: uint16(sz.Width)})
	}
}

// copy starts the stream copiers; the returned group covers the output
// ones (stdin's may block on the caller's reader and is not waited for).
func (e *execEnds) copy(stdin io.Reader, stdout, stderr io.Writer, resize <-chan TermSize) *sync.WaitGroup {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	var wg sync.WaitGroup
	out := func(w io.Writer, r *os.File) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(w, r) // a terminal's end reads EIO once the command is gone
		}()
	}
	if e.master != nil {
		out(stdout, e.master)
		if stdin != nil {
			go func() { _, _ = io.Copy(e.master, stdin) }()
		}
		go func() {
			for {
				select {
				case sz, ok := <-resize:
					if !ok {
						return
					}
					setSize(e.master, sz)
				case <-e.stop:
					return
				}
			}
		}()
		return &wg
	}
	out(stdout, e.outR)
	out(stderr, e.errR)
	go func() {
		if stdin != nil {
			_, _ = io.Copy(e.inW, stdin)
		}
		e.inW.Close()
	}()
	return &wg
}

// drain lets the output copiers read what is buffered for up to d, then
// unblocks them.
func (e *execEnds) drain(d time.Duration) {
	for _, f := range []*os.File{e.master, e.outR, e.errR} {
		if f != nil {
			_ = f.SetReadDeadline(time.Now().Add(d))
		}
	}
}

func sendExec(c *net.UnixConn, cmd []string, tty bool, files []*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	if _, _, err := c.WriteMsgUnix([]byte{wire.PrefaceExec}, unix.UnixRights(fds...), nil); err != nil {
		return err
	}
	body, err := json.Marshal(wire.ExecRequest{Cmd: cmd, TTY: tty})
	if err != nil {
		return err
	}
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	_, err = c.Write(append(msg, body...))
	return err
}

// serveExec runs one exec connection's command in the engine's context.
func (s *server) serveExec(c *net.UnixConn, files []*os.File) {
	defer c.Close()
	defer closeAll(files)
	reply := func(r wire.ExecReply) { _ = json.NewEncoder(c).Encode(r) }
	req, err := readExecRequest(c)
	if err == nil {
		err = checkArgv(req.Cmd)
	}
	if want := map[bool]int{true: 1, false: 3}[req.TTY]; err == nil && len(files) != want {
		err = fmt.Errorf("exec request carries %d file descriptors, want %d", len(files), want)
	}
	var cmd *exec.Cmd
	if err == nil {
		cmd, err = s.execCmd(req, files)
	}
	var ch *child
	if err == nil {
		ch, err = spawn(cmd, s.cmd.NetNS)
	}
	if err != nil {
		reply(wire.ExecReply{ExitCode: -1, Error: err.Error()})
		return
	}
	closeAll(files) // the command holds them now
	go func() {
		_, _ = io.Copy(io.Discard, c) // ends when the client hangs up (its ctx ended)
		select {
		case <-ch.done:
		default:
			_ = syscall.Kill(-ch.pid, syscall.SIGKILL)
		}
	}()
	<-ch.done
	reply(wire.ExecReply{ExitCode: ch.exit.ExitCode})
}

func readExecRequest(c io.Reader) (wire.ExecRequest, error) {
	var req wire.ExecRequest
	var n uint32
	if err := binary.Read(c, binary.BigEndian, &n); err != nil {
		return req, fmt.Errorf("reading exec request: %w", err)
	}
	if n > wire.MaxExecRequest {
		return req, fmt.Errorf("exec request of %d bytes exceeds %d", n, wire.MaxExecRequest)
	}
	err := json.NewDecoder(io.LimitReader(c, int64(n))).Decode(&req)
	if err != nil {
		return req, fmt.Errorf("decoding exec request: %w", err)
	}
	return req, nil
}

// execCmd is an exec's command in the engine's context, in its own process
// group (its own session on a terminal), killed with the supervisor.
func (s *server) execCmd(req wire.ExecRequest, files []*os.File) (*exec.Cmd, error) {
	path, err := lookPath(req.Cmd[0], s.cmd.Env)
	if err != nil {
		return nil, err
	}
	env := s.cmd.Env
	if env == nil {
		env = []string{}
	}
	cmd := &exec.Cmd{Path: path, Args: req.Cmd, Env: env, Dir: s.cmd.Dir,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: s.cred}}
	if req.TTY {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[0], files[0]
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
		return cmd, nil
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	cmd.SysProcAttr.Setpgid = true
	return cmd, nil
}

// tailBuffer keeps the last max bytes written to it; safe for concurrent
// writers (an exec's stdout and stderr copiers).
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}
