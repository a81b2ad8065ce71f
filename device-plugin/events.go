package deviceplugin

import (
	"context"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// watchedEvents are the NVML events that can make a GPU unhealthy.
const watchedEvents = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)

// noInstance is NVML's GpuInstanceId for an event not tied to a MIG instance.
const noInstance = 0xFFFFFFFF

// eventWatcher is a running watchEvents goroutine.
type eventWatcher struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (p *Plugin) startWatcher(ctx context.Context, gpus []physicalGPU) *eventWatcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &eventWatcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		p.watchEvents(ctx, gpus)
	}()
	return w
}

// stop ends the watcher and waits for it; a nil watcher is a no-op.
func (w *eventWatcher) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// watchEvents registers the GPUs for Xid and double-bit ECC events and marks
// devices unhealthy as critical ones arrive, until ctx ends.
func (p *Plugin) watchEvents(ctx context.Context, gpus []physicalGPU) {
	set, ret := p.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		p.logger.Warn("cannot create NVML event set; Xid health checks are off", "error", ret)
		return
	}
	defer set.Free()

	registered := 0
	for _, g := range gpus {
		mask, ret := g.handle.GetSupportedEventTypes()
		if ret == nvml.ERROR_GPU_IS_LOST {
			p.markLost(g.UUID)
			continue
		}
		if ret != nvml.SUCCESS || mask&watchedEvents == 0 {
			p.logger.Warn("GPU reports no Xid events; its Xid health checks are off", "gpu", g.UUID, "error", ret)
			continue
		}
		if ret := g.handle.RegisterEvents(mask&watchedEvents, set); ret != nvml.SUCCESS {
			if ret == nvml.ERROR_GPU_IS_LOST {
				p.markLost(g.UUID)
				continue
			}
			p.logger.Warn("registering GPU for Xid events failed; its Xid health checks are off", "gpu", g.UUID, "error", ret)
			continue
		}
		registered++
	}
	if registered == 0 {
		return
	}

	backoff := time.Duration(0)
	var lastErr nvml.Return = nvml.SUCCESS
	for ctx.Err() == nil {
		data, ret := set.Wait(uint32(p.eventWait / time.Millisecond))
		switch ret {
		case nvml.SUCCESS:
			backoff, lastErr = 0, nvml.SUCCESS
			p.handleEvent(gpus, data)
			continue
		case nvml.ERROR_TIMEOUT:
			backoff, lastErr = 0, nvml.SUCCESS
			continue
		case nvml.ERROR_GPU_IS_LOST:
			// Which GPU is not said: a rescan finds out.
			p.requestRefresh()
		default:
			if ret != lastErr {
				p.logger.Warn("waiting for NVML events failed; retrying", "error", ret)
			}
		}
		lastErr = ret
		// Errors come back immediately; back off so a broken set cannot spin.
		backoff = min(max(2*backoff, 100*time.Millisecond), 30*time.Second)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
}

// handleEvent turns one NVML event into a health change.
func (p *Plugin) handleEvent(gpus []physicalGPU, e nvml.EventData) {
	physical := ""
	if e.Device != nil {
		if uuid, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
			physical = uuid
		} else {
			for _, g := range gpus {
				if g.handle == e.Device {
					physical = g.UUID
				}
			}
		}
	}
	if physical == "" {
		p.logger.Warn("NVML event for an unknown GPU", "type", e.EventType, "data", e.EventData)
		return
	}
	giID := -1
	if e.GpuInstanceId != noInstance {
		giID = int(e.GpuInstanceId)
	}

	var reason string
	switch e.EventType {
	case nvml.EventTypeXidCriticalError:
		reason = xidReason(e.EventData)
		if reason == "" {
			p.logger.Warn("GPU reported an application Xid; device stays healthy", "gpu", physical, "xid", e.EventData)
			return
		}
	case nvml.EventTypeDoubleBitEccError:
		reason = "double-bit ECC error event: uncorrectable memory error, GPU reset required"
	default:
		return
	}
	p.markXID(physical, giID, reason)
}
