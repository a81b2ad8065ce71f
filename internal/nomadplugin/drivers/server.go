package drivers

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// server serves a DriverPlugin as Nomad's Driver gRPC service.
type server struct {
	driverspb.UnimplementedDriverServer
	impl DriverPlugin
}

// toStatus maps a driver error to the gRPC status Nomad's client reads:
// recoverable errors carry the RecoverableError detail, ErrTaskNotFound is
// NotFound with Nomad's message.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrTaskNotFound) {
		return status.Error(codes.NotFound, ErrTaskNotFound.Error())
	}
	return structs.GRPCStatusError(err)
}

func (s *server) TaskConfigSchema(context.Context, *driverspb.TaskConfigSchemaRequest) (*driverspb.TaskConfigSchemaResponse, error) {
	spec, err := s.impl.TaskConfigSchema()
	if err != nil {
		return nil, toStatus(err)
	}
	return &driverspb.TaskConfigSchemaResponse{Spec: spec}, nil
}

func (s *server) Capabilities(context.Context, *driverspb.CapabilitiesRequest) (*driverspb.CapabilitiesResponse, error) {
	caps, err := s.impl.Capabilities()
	if err != nil {
		return nil, toStatus(err)
	}
	if caps == nil {
		return nil, status.Error(codes.Internal, "driver returned no capabilities")
	}
	return &driverspb.CapabilitiesResponse{Capabilities: CapabilitiesToProto(caps)}, nil
}

func (s *server) Fingerprint(_ *driverspb.FingerprintRequest, srv driverspb.Driver_FingerprintServer) error {
	ctx := srv.Context()
	ch, err := s.impl.Fingerprint(ctx)
	if err != nil {
		return toStatus(err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case f, ok := <-ch:
			if !ok {
				return nil
			}
			if f == nil {
				continue
			}
			if err := srv.Send(FingerprintToProto(f)); err != nil {
				return err
			}
		}
	}
}

func (s *server) RecoverTask(_ context.Context, req *driverspb.RecoverTaskRequest) (*driverspb.RecoverTaskResponse, error) {
	if req.GetHandle() == nil {
		return nil, status.Error(codes.InvalidArgument, "handle: missing")
	}
	if err := s.impl.RecoverTask(TaskHandleFromProto(req.GetHandle())); err != nil {
		return nil, toStatus(err)
	}
	return &driverspb.RecoverTaskResponse{}, nil
}

func (s *server) StartTask(_ context.Context, req *driverspb.StartTaskRequest) (*driverspb.StartTaskResponse, error) {
	if req.GetTask() == nil {
		return nil, status.Error(codes.InvalidArgument, "task: missing")
	}
	handle, net, err := s.impl.StartTask(TaskConfigFromProto(req.GetTask()))
	if err != nil {
		return nil, toStatus(err)
	}
	return &driverspb.StartTaskResponse{Handle: TaskHandleToProto(handle), NetworkOverride: DriverNetworkToProto(net)}, nil
}

func (s *server) WaitTask(ctx context.Context, req *driverspb.WaitTaskRequest) (*driverspb.WaitTaskResponse, error) {
	ch, err := s.impl.WaitTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, toStatus(err)
	}
	select {
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case res, ok := <-ch:
		if !ok || res == nil {
			return &driverspb.WaitTaskResponse{Err: "channel closed"}, nil
		}
		resp := &driverspb.WaitTaskResponse{Result: ExitResultToProto(res)}
		if res.Err != nil {
			resp.Err = res.Err.Error()
		}
		return resp, nil
	}
}

func (s *server) StopTask(_ context.Context, req *driverspb.StopTaskRequest) (*driverspb.StopTaskResponse, error) {
	if err := req.GetTimeout().CheckValid(); req.GetTimeout() != nil && err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "timeout: %v", err)
	}
	if err := s.impl.StopTask(req.GetTaskId(), req.GetTimeout().AsDuration(), req.GetSignal()); err != nil {
		return nil, toStatus(err)
	}
	return &driverspb.StopTaskResponse{}, nil
}

func (s *server) DestroyTask(_ context.Context, req *driverspb.DestroyTaskRequest) (*driverspb.DestroyTaskResponse, error) {
	if err := s.impl.DestroyTask(req.GetTaskId(), req.GetForce()); err != nil {
		return nil, toStatus(err)
	}
	return &driverspb.DestroyTaskResponse{}, nil
}

func (s *server) InspectTask(_ context.Context, req *driverspb.InspectTaskRequest) (*driverspb.InspectTaskResponse, error) {
	st, err := s.impl.InspectTask(req.GetTaskId())
	if err != nil {
		return nil, toStatus(err)
	}
	if st == nil {
		return nil, status.Error(codes.Internal, "driver returned no task status")
	}
	return &driverspb.InspectTaskResponse{
		Task:            TaskStatusToProto(st),
		Driver:          &driverspb.TaskDriverStatus{Attributes: st.DriverAttributes},
		NetworkOverride: DriverNetworkToProto(st.NetworkOverride),
	}, nil
}

func (s *server) TaskStats(req *driverspb.TaskStatsRequest, srv driverspb.Driver_TaskStatsServer) error {
	if err := req.GetCollectionInterval().CheckValid(); err != nil {
		return status.Errorf(codes.InvalidArgument, "collection_interval: %v", err)
	}
	interval := req.GetCollectionInterval().AsDuration()
	if interval <= 0 {
		return status.Error(codes.InvalidArgument, "collection_interval: must be positive")
	}
	ch, err := s.impl.TaskStats(srv.Context(), req.GetTaskId(), interval)
	if err != nil {
		return toStatus(err)
	}
	for u := range ch {
		if u == nil {
			continue
		}
		if err := srv.Send(&driverspb.TaskStatsResponse{Stats: TaskStatsToProto(u)}); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}

func (s *server) TaskEvents(_ *driverspb.TaskEventsRequest, srv driverspb.Driver_TaskEventsServer) error {
	ch, err := s.impl.TaskEvents(srv.Context())
	if err != nil {
		return toStatus(err)
	}
	for ev := range ch {
		if ev == nil {
			continue
		}
		if err := srv.Send(TaskEventToProto(ev)); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return nil
}

func (s *server) SignalTask(_ context.Context, req *driverspb.SignalTaskRequest) (*driverspb.SignalTaskResponse, error) {
	if err := s.impl.SignalTask(req.GetTaskId(), req.GetSignal()); err != nil {
		return nil, toStatus(err)
	}
	return &driverspb.SignalTaskResponse{}, nil
}

func (s *server) ExecTask(_ context.Context, req *driverspb.ExecTaskRequest) (*driverspb.ExecTaskResponse, error) {
	if err := req.GetTimeout().CheckValid(); req.GetTimeout() != nil && err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "timeout: %v", err)
	}
	res, err := s.impl.ExecTask(req.GetTaskId(), req.GetCommand(), req.GetTimeout().AsDuration())
	if err != nil {
		return nil, toStatus(err)
	}
	if res == nil {
		return nil, status.Error(codes.Internal, "driver returned no exec result")
	}
	return &driverspb.ExecTaskResponse{Stdout: res.Stdout, Stderr: res.Stderr, Result: ExitResultToProto(res.ExitResult)}, nil
}

func (s *server) ExecTaskStreaming(srv driverspb.Driver_ExecTaskStreamingServer) error {
	msg, err := srv.Recv()
	if err != nil {
		return fmt.Errorf("receiving the first exec message: %w", err)
	}
	setup := msg.GetSetup()
	if setup == nil {
		return status.Error(codes.InvalidArgument, "setup: the first exec message must carry it")
	}
	ctx := srv.Context()
	if raw, ok := s.impl.(ExecTaskStreamingRawDriver); ok {
		return toStatus(raw.ExecTaskStreamingRaw(ctx, setup.GetTaskId(), setup.GetCommand(), setup.GetTty(), srv))
	}
	d, ok := s.impl.(ExecTaskStreamingDriver)
	if !ok {
		return status.Error(codes.Unimplemented, "driver does not support exec")
	}
	return toStatus(serveExecStream(ctx, d, setup, srv))
}

func (s *server) CreateNetwork(context.Context, *driverspb.CreateNetworkRequest) (*driverspb.CreateNetworkResponse, error) {
	return nil, status.Error(codes.Unimplemented, "CreateNetwork RPC not supported by driver")
}

func (s *server) DestroyNetwork(context.Context, *driverspb.DestroyNetworkRequest) (*driverspb.DestroyNetworkResponse, error) {
	return nil, status.Error(codes.Unimplemented, "DestroyNetwork RPC not supported by driver")
}
