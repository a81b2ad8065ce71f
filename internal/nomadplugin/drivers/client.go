package drivers

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// Client calls a driver plugin over gRPC as a Nomad client does; Oasis's
// tests use it to drive the llm driver through the wire protocol.
type Client struct {
	*base.Client
	driver  driverspb.DriverClient
	doneCtx context.Context
}

var _ DriverPlugin = (*Client)(nil)

// fromStatus maps the driver's gRPC errors back: NotFound is
// ErrTaskNotFound, a RecoverableError detail a *structs.RecoverableError.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.NotFound {
		return ErrTaskNotFound
	}
	return structs.ErrorFromGRPC(err)
}

// TaskConfigSchema asks for the driver's task config schema.
func (c *Client) TaskConfigSchema() (*hclspec.Spec, error) {
	resp, err := c.driver.TaskConfigSchema(c.doneCtx, &driverspb.TaskConfigSchemaRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	return resp.GetSpec(), nil
}

// Capabilities asks what the driver supports.
func (c *Client) Capabilities() (*Capabilities, error) {
	resp, err := c.driver.Capabilities(c.doneCtx, &driverspb.CapabilitiesRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	return CapabilitiesFromProto(resp.GetCapabilities()), nil
}

// Fingerprint streams the driver's fingerprints until ctx ends.
func (c *Client) Fingerprint(ctx context.Context) (<-chan *Fingerprint, error) {
	stream, err := c.driver.Fingerprint(ctx, &driverspb.FingerprintRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	return recvAll(ctx, stream.Recv, func(pb *driverspb.FingerprintResponse) *Fingerprint { return FingerprintFromProto(pb) }), nil
}

// recvAll copies a server stream into a channel until the stream or ctx
// ends.
func recvAll[P any, T any](ctx context.Context, recv func() (P, error), conv func(P) T) <-chan T {
	ch := make(chan T)
	go func() {
		defer close(ch)
		for {
			pb, err := recv()
			if err != nil {
				return
			}
			select {
			case ch <- conv(pb):
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// RecoverTask reattaches the driver to a task after a restart.
func (c *Client) RecoverTask(h *TaskHandle) error {
	_, err := c.driver.RecoverTask(c.doneCtx, &driverspb.RecoverTaskRequest{TaskId: h.Config.ID, Handle: TaskHandleToProto(h)})
	return fromStatus(err)
}

// StartTask starts a task.
func (c *Client) StartTask(cfg *TaskConfig) (*TaskHandle, *DriverNetwork, error) {
	resp, err := c.driver.StartTask(c.doneCtx, &driverspb.StartTaskRequest{Task: TaskConfigToProto(cfg)})
	if err != nil {
		return nil, nil, fromStatus(err)
	}
	return TaskHandleFromProto(resp.GetHandle()), DriverNetworkFromProto(resp.GetNetworkOverride()), nil
}

// WaitTask returns a channel that receives the task's exit result.
func (c *Client) WaitTask(ctx context.Context, taskID string) (<-chan *ExitResult, error) {
	ch := make(chan *ExitResult, 1)
	go func() {
		defer close(ch)
		resp, err := c.driver.WaitTask(ctx, &driverspb.WaitTaskRequest{TaskId: taskID})
		if err != nil {
			ch <- &ExitResult{Err: fromStatus(err)}
			return
		}
		res := ExitResultFromProto(resp.GetResult())
		if resp.GetErr() != "" {
			res.Err = errors.New(resp.GetErr())
		}
		ch <- res
	}()
	return ch, nil
}

// StopTask stops a task: signal, then SIGKILL after timeout.
func (c *Client) StopTask(taskID string, timeout time.Duration, signal string) error {
	_, err := c.driver.StopTask(c.doneCtx, &driverspb.StopTaskRequest{TaskId: taskID, Timeout: durationToProto(timeout), Signal: signal})
	return fromStatus(err)
}

// DestroyTask cleans a task up.
func (c *Client) DestroyTask(taskID string, force bool) error {
	_, err := c.driver.DestroyTask(c.doneCtx, &driverspb.DestroyTaskRequest{TaskId: taskID, Force: force})
	return fromStatus(err)
}

// InspectTask returns a task's status.
func (c *Client) InspectTask(taskID string) (*TaskStatus, error) {
	resp, err := c.driver.InspectTask(c.doneCtx, &driverspb.InspectTaskRequest{TaskId: taskID})
	if err != nil {
		return nil, fromStatus(err)
	}
	st := TaskStatusFromProto(resp.GetTask())
	st.DriverAttributes = resp.GetDriver().GetAttributes()
	st.NetworkOverride = DriverNetworkFromProto(resp.GetNetworkOverride())
	return st, nil
}

// TaskStats streams a task's resource usage every interval.
func (c *Client) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *TaskResourceUsage, error) {
	stream, err := c.driver.TaskStats(ctx, &driverspb.TaskStatsRequest{TaskId: taskID, CollectionInterval: durationToProto(interval)})
	if err != nil {
		return nil, fromStatus(err)
	}
	return recvAll(ctx, stream.Recv, func(pb *driverspb.TaskStatsResponse) *TaskResourceUsage { return TaskStatsFromProto(pb.GetStats()) }), nil
}

// TaskEvents streams the driver's task events.
func (c *Client) TaskEvents(ctx context.Context) (<-chan *TaskEvent, error) {
	stream, err := c.driver.TaskEvents(ctx, &driverspb.TaskEventsRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	return recvAll(ctx, stream.Recv, TaskEventFromProto), nil
}

// SignalTask sends a signal to a task.
func (c *Client) SignalTask(taskID, signal string) error {
	_, err := c.driver.SignalTask(c.doneCtx, &driverspb.SignalTaskRequest{TaskId: taskID, Signal: signal})
	return fromStatus(err)
}

// ExecTask runs a command in a task's context.
func (c *Client) ExecTask(taskID string, cmd []string, timeout time.Duration) (*ExecTaskResult, error) {
	resp, err := c.driver.ExecTask(c.doneCtx, &driverspb.ExecTaskRequest{TaskId: taskID, Command: cmd, Timeout: durationToProto(timeout)})
	if err != nil {
		return nil, fromStatus(err)
	}
	return &ExecTaskResult{Stdout: resp.GetStdout(), Stderr: resp.GetStderr(), ExitResult: ExitResultFromProto(resp.GetResult())}, nil
}

// ExecTaskStreaming runs a command in a task's context over the streaming
// exec RPC, copying stdin and collecting stdout and stderr into opts.
func (c *Client) ExecTaskStreaming(ctx context.Context, taskID string, opts *ExecOptions) (*ExitResult, error) {
	stream, err := c.driver.ExecTaskStreaming(ctx)
	if err != nil {
		return nil, fromStatus(err)
	}
	setup := &driverspb.ExecTaskStreamingRequest{Setup: &driverspb.ExecTaskStreamingRequest_Setup{TaskId: taskID, Command: opts.Command, Tty: opts.Tty}}
	if err := stream.Send(setup); err != nil {
		return nil, fromStatus(err)
	}
	if opts.Stdin != nil {
		go sendStdin(stream, opts.Stdin)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("exec stream ended without an exit result")
		}
		if err != nil {
			return nil, fromStatus(err)
		}
		if err := copyExecOutput(msg, opts); err != nil {
			return nil, err
		}
		if msg.GetExited() {
			return ExitResultFromProto(msg.GetResult()), nil
		}
	}
}

func sendStdin(stream driverspb.Driver_ExecTaskStreamingClient, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			op := &driverspb.ExecTaskStreamingIOOperation{Data: append([]byte(nil), buf[:n]...)}
			if stream.Send(&driverspb.ExecTaskStreamingRequest{Stdin: op}) != nil {
				return
			}
		}
		if err != nil {
			_ = stream.Send(&driverspb.ExecTaskStreamingRequest{Stdin: &driverspb.ExecTaskStreamingIOOperation{Close: true}})
			return
		}
	}
}

func copyExecOutput(msg *driverspb.ExecTaskStreamingResponse, opts *ExecOptions) error {
	for _, o := range []struct {
		op *driverspb.ExecTaskStreamingIOOperation
		w  io.Writer
	}{{msg.GetStdout(), opts.Stdout}, {msg.GetStderr(), opts.Stderr}} {
		if o.op == nil || o.w == nil || len(o.op.GetData()) == 0 {
			continue
		}
		if _, err := o.w.Write(o.op.GetData()); err != nil {
			return err
		}
	}
	return nil
}
