package drivers

import (
	"context"
	"errors"
	"io"
	"sync"

	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
)

// serveExecStream runs one streaming exec session of an
// ExecTaskStreamingDriver: stdin and terminal sizes from the client's
// messages, stdout and stderr as messages back, then the exit result.
func serveExecStream(ctx context.Context, d ExecTaskStreamingDriver, setup *driverspb.ExecTaskStreamingRequest_Setup, stream ExecTaskStream) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stdinR, stdinW := io.Pipe()
	resize := make(chan TerminalSize, 2)
	go pumpExecInput(ctx, stream, stdinW, resize)

	var sendMu sync.Mutex
	send := func(m *ExecTaskStreamingResponseMsg) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	stdout := &execWriter{send: send, wrap: func(op *driverspb.ExecTaskStreamingIOOperation) *ExecTaskStreamingResponseMsg {
		return &ExecTaskStreamingResponseMsg{Stdout: op}
	}}
	stderr := &execWriter{send: send, wrap: func(op *driverspb.ExecTaskStreamingIOOperation) *ExecTaskStreamingResponseMsg {
		return &ExecTaskStreamingResponseMsg{Stderr: op}
	}}
	res, err := d.ExecTaskStreaming(ctx, setup.GetTaskId(), &ExecOptions{
		Command: setup.GetCommand(), Tty: setup.GetTty(),
		Stdin: stdinR, Stdout: stdout, Stderr: stderr, ResizeCh: resize,
	})
	_ = stdinR.Close()
	if err != nil {
		return err
	}
	_ = stdout.Close()
	_ = stderr.Close()
	return send(&ExecTaskStreamingResponseMsg{Exited: true, Result: ExitResultToProto(res)})
}

// pumpExecInput copies the client's stdin and terminal sizes until the
// stream or ctx ends.
func pumpExecInput(ctx context.Context, stream ExecTaskStream, stdin *io.PipeWriter, resize chan<- TerminalSize) {
	defer stdin.Close()
	for {
		msg, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = stdin.CloseWithError(err)
			}
			return
		}
		switch {
		case msg.GetStdin() != nil && msg.GetStdin().GetClose():
			_ = stdin.Close()
		case msg.GetStdin() != nil:
			if _, err := stdin.Write(msg.GetStdin().GetData()); err != nil {
				return
			}
		case msg.GetTtySize() != nil:
			select {
			case resize <- TerminalSize{Height: int(msg.GetTtySize().GetHeight()), Width: int(msg.GetTtySize().GetWidth())}:
			case <-ctx.Done():
				return
			}
		default:
			// A message with nothing set is the client's heartbeat.
		}
	}
}

// execWriter sends what is written to it as stdout or stderr messages.
type execWriter struct {
	send func(*ExecTaskStreamingResponseMsg) error
	wrap func(*driverspb.ExecTaskStreamingIOOperation) *ExecTaskStreamingResponseMsg
	once sync.Once
}

func (w *execWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	data := append([]byte(nil), p...)
	if err := w.send(w.wrap(&driverspb.ExecTaskStreamingIOOperation{Data: data})); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *execWriter) Close() error {
	var err error
	w.once.Do(func() { err = w.send(w.wrap(&driverspb.ExecTaskStreamingIOOperation{Close: true})) })
	return err
}
