package device

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	devicepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// shutdownGrace is how long a failed call waits to learn whether the plugin
// process exited (go-plugin ends doneCtx a moment after the connection
// breaks), to tell ErrPluginShutdown from a plain transport error.
const shutdownGrace = time.Second

// client is a DevicePlugin that calls a plugin process over gRPC.
type client struct {
	base.BasePlugin
	client devicepb.DevicePluginClient
	// doneCtx ends when the plugin process exits.
	doneCtx context.Context
}

var _ DevicePlugin = (*client)(nil)

// Fingerprint opens the plugin's fingerprint stream. The channel closes when
// ctx ends or the stream ends; a stream that fails delivers one response
// carrying the error first (ErrPluginShutdown when the plugin exited).
func (c *client) Fingerprint(ctx context.Context) (<-chan *FingerprintResponse, error) {
	sctx, cancel := c.join(ctx)
	stream, err := c.client.Fingerprint(sctx, &devicepb.FingerprintRequest{})
	if err != nil {
		cancel()
		return nil, c.callError(ctx, err)
	}
	out := make(chan *FingerprintResponse, 1)
	go func() {
		defer cancel()
		receive(ctx, stream, out, c.callError, func(m *devicepb.FingerprintResponse, err error) *FingerprintResponse {
			if err != nil {
				return NewFingerprintError(err)
			}
			return NewFingerprint(DeviceGroupsFromProto(m.GetDeviceGroup())...)
		})
	}()
	return out, nil
}

// Stats opens the plugin's stats stream at interval, like Fingerprint.
func (c *client) Stats(ctx context.Context, interval time.Duration) (<-chan *StatsResponse, error) {
	sctx, cancel := c.join(ctx)
	stream, err := c.client.Stats(sctx, &devicepb.StatsRequest{CollectionInterval: durationpb.New(interval)})
	if err != nil {
		cancel()
		return nil, c.callError(ctx, err)
	}
	out := make(chan *StatsResponse, 1)
	go func() {
		defer cancel()
		receive(ctx, stream, out, c.callError, func(m *devicepb.StatsResponse, err error) *StatsResponse {
			if err != nil {
				return NewStatsError(err)
			}
			return &StatsResponse{Groups: DeviceGroupStatsFromProto(m.GetGroups())}
		})
	}()
	return out, nil
}

// receive delivers a stream's messages on out, converted by conv, until the
// stream ends (io.EOF: out just closes), fails (one error response, unless
// ctx ended) or ctx ends.
func receive[M any, R any](ctx context.Context, stream grpc.ServerStreamingClient[M], out chan<- R,
	callErr func(context.Context, error) error, conv func(*M, error) R,
) {
	defer close(out)
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			err = callErr(ctx, err)
			if ctx.Err() != nil {
				return // the caller ended the stream; nobody waits for the error
			}
			select {
			case out <- conv(nil, err):
			case <-ctx.Done():
			}
			return
		}
		select {
		case out <- conv(m, nil):
		case <-ctx.Done():
			return
		}
	}
}

// Reserve asks the plugin how to expose deviceIDs to a task.
func (c *client) Reserve(deviceIDs []string) (*ContainerReservation, error) {
	resp, err := c.client.Reserve(c.doneCtx, &devicepb.ReserveRequest{DeviceIds: deviceIDs})
	if err != nil {
		return nil, c.callError(context.Background(), err)
	}
	return ContainerReservationFromProto(resp.GetContainerRes()), nil
}

// join returns a context that ends with ctx or when the plugin exits.
func (c *client) join(ctx context.Context) (context.Context, context.CancelFunc) {
	joined, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.doneCtx, cancel)
	return joined, func() {
		stop()
		cancel()
	}
}

// callError turns a failed call's error into what callers can test for:
// ErrPluginShutdown when the plugin exited, reqCtx's error when the caller
// ended the call, ErrPluginDisabled for a disabled plugin, the plugin's own
// error (a RecoverableError keeps its flag) otherwise.
func (c *client) callError(reqCtx context.Context, err error) error {
	if code := status.Code(err); code == codes.Unavailable || code == codes.Canceled {
		timer := time.NewTimer(shutdownGrace)
		defer timer.Stop()
		select {
		case <-c.doneCtx.Done():
			return ErrPluginShutdown
		case <-reqCtx.Done():
			if c.doneCtx.Err() != nil {
				return ErrPluginShutdown
			}
			return reqCtx.Err()
		case <-timer.C:
		}
	}
	if c.doneCtx.Err() != nil {
		return ErrPluginShutdown
	}
	if status.Convert(err).Message() == ErrPluginDisabled.Error() {
		return ErrPluginDisabled
	}
	return structs.ErrorFromGRPC(err)
}
