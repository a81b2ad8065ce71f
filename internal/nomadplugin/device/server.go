package device

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	devicepb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// defaultStatsInterval is used when the client asks for no (or a
// non-positive) collection interval, as Nomad's own plugin SDK does.
const defaultStatsInterval = time.Second

// maxReserveIDs bounds a Reserve request: a node has a handful of devices,
// never thousands.
const maxReserveIDs = 4096

// server serves a DevicePlugin as the gRPC DevicePlugin service.
type server struct {
	devicepb.UnimplementedDevicePluginServer
	impl DevicePlugin
}

// Fingerprint relays the plugin's fingerprints until the client goes away
// (the stream's context ends) or the plugin closes its channel. A response
// carrying an error ends the stream with that error as a gRPC status.
func (s *server) Fingerprint(_ *devicepb.FingerprintRequest, stream grpc.ServerStreamingServer[devicepb.FingerprintResponse]) error {
	ctx := stream.Context()
	ch, err := s.impl.Fingerprint(ctx)
	if err != nil {
		return structs.GRPCStatusError(err)
	}
	return relay(ctx, ch, stream.Send, func(r *FingerprintResponse) (*devicepb.FingerprintResponse, error) {
		if r.Error != nil {
			return nil, r.Error
		}
		return &devicepb.FingerprintResponse{DeviceGroup: DeviceGroupsToProto(r.Devices)}, nil
	})
}

// Stats relays the plugin's statistics samples like Fingerprint.
func (s *server) Stats(req *devicepb.StatsRequest, stream grpc.ServerStreamingServer[devicepb.StatsResponse]) error {
	ctx := stream.Context()
	interval := defaultStatsInterval
	if d := req.GetCollectionInterval(); d != nil {
		if err := d.CheckValid(); err != nil {
			return status.Errorf(codes.InvalidArgument, "collection_interval: %v", err)
		}
		if d.AsDuration() > 0 {
			interval = d.AsDuration()
		}
	}
	ch, err := s.impl.Stats(ctx, interval)
	if err != nil {
		return structs.GRPCStatusError(err)
	}
	return relay(ctx, ch, stream.Send, func(r *StatsResponse) (*devicepb.StatsResponse, error) {
		if r.Error != nil {
			return nil, r.Error
		}
		return &devicepb.StatsResponse{Groups: DeviceGroupStatsToProto(r.Groups)}, nil
	})
}

// relay sends what the plugin's channel carries, converted, until ctx ends
// (nil: the client went away), the channel closes (nil: end of stream) or a
// response carries an error (returned as a gRPC status). A nil response is
// skipped.
func relay[In any, Out any](ctx context.Context, ch <-chan *In, send func(*Out) error, conv func(*In) (*Out, error)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case r, ok := <-ch:
			if !ok {
				return nil
			}
			if r == nil {
				continue
			}
			msg, err := conv(r)
			if err != nil {
				return structs.GRPCStatusError(err)
			}
			if err := send(msg); err != nil {
				return err
			}
		}
	}
}

// Reserve asks the plugin how to expose the devices.
func (s *server) Reserve(_ context.Context, req *devicepb.ReserveRequest) (*devicepb.ReserveResponse, error) {
	if n := len(req.GetDeviceIds()); n > maxReserveIDs {
		return nil, status.Errorf(codes.InvalidArgument, "device_ids: %d ids, at most %d", n, maxReserveIDs)
	}
	res, err := s.impl.Reserve(req.GetDeviceIds())
	if err != nil {
		return nil, structs.GRPCStatusError(err)
	}
	return &devicepb.ReserveResponse{ContainerRes: ContainerReservationToProto(res)}, nil
}
