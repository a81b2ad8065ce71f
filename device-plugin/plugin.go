// Package deviceplugin is Oasis's Nomad device plugin for NVIDIA GPUs
// (device id "nvidia/gpu"): a drop-in replacement for nomad-device-nvidia
// that reports power in watts, a cumulative energy counter, clock-event
// (throttle) reasons, and marks GPUs unhealthy on critical Xid events or when
// they fall off the bus. All NVML access goes through an injected
// nvml.Interface so tests run against go-nvml's mocks.
package deviceplugin

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

const (
	// PluginName is the name in PluginInfo; it matches the binary name, so
	// the agent's `plugin "nomad-device-gpu" { ... }` block configures it.
	PluginName = "nomad-device-gpu"
	// PluginVersion is reported to Nomad, which prefers the highest version
	// when several plugins share a name.
	PluginVersion = "0.1.0"

	vendor     = "nvidia"
	deviceType = device.DeviceTypeGPU

	envNvidiaVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	envCUDAVisibleDevices   = "CUDA_VISIBLE_DEVICES"

	defaultEventWait = time.Second
)

var pluginInfo = &base.PluginInfoResponse{
	Type:              base.PluginTypeDevice,
	PluginApiVersions: []string{device.ApiVersion010},
	PluginVersion:     PluginVersion,
	Name:              PluginName,
}

// healthState is why a device is unhealthy; empty fields mean healthy.
type healthState struct {
	lost string // set while NVML reports the GPU lost
	xid  string // set by a critical Xid; cleared when the GPU comes back from lost (reset)
}

func (h healthState) healthy() bool { return h.lost == "" && h.xid == "" }

func (h healthState) desc() string {
	switch {
	case h.lost != "" && h.xid != "":
		return h.lost + "; " + h.xid
	case h.lost != "":
		return h.lost
	default:
		return h.xid
	}
}

// Plugin implements device.DevicePlugin.
type Plugin struct {
	logger    hclog.Logger
	lib       nvml.Interface
	eventWait time.Duration // how long one NVML event wait blocks

	// notify wakes the fingerprint loop when health changed between scans.
	notify chan struct{}

	mu          sync.Mutex
	cfg         Config
	initialized bool
	unavailable string          // why no devices are reported; logged when it changes
	lastScanErr string          // set while the last rescan failed: every known device is reported unhealthy
	devices     map[string]*gpu // current inventory, by device id
	health      map[string]healthState
}

var _ device.DevicePlugin = (*Plugin)(nil)

// New returns a plugin that reads GPUs through lib (nvml.New() in
// production, a go-nvml mock in tests). It does not touch NVML until the
// first Fingerprint: Nomad starts each plugin once just to validate its
// config. A nil logger discards the plugin's logs.
func New(logger hclog.Logger, lib nvml.Interface) *Plugin {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Plugin{
		logger:    logger.Named(PluginName),
		lib:       lib,
		eventWait: defaultEventWait,
		notify:    make(chan struct{}, 1),
		cfg:       DefaultConfig(),
		// Not "": the first scan that finds GPUs logs them.
		unavailable: "not scanned yet",
		devices:     map[string]*gpu{},
		health:      map[string]healthState{},
	}
}

// PluginInfo describes the plugin to Nomad.
func (p *Plugin) PluginInfo() (*base.PluginInfoResponse, error) { return pluginInfo, nil }

// ConfigSchema returns the plugin block schema.
func (p *Plugin) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

// SetConfig applies the plugin block.
func (p *Plugin) SetConfig(c *base.Config) error {
	cfg, err := decodeConfig(c.PluginConfig)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.cfg = cfg
	p.mu.Unlock()
	return nil
}

func (p *Plugin) config() Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// Fingerprint streams the device groups: once at start, then whenever the
// set of devices, their attributes or their health change.
func (p *Plugin) Fingerprint(ctx context.Context) (<-chan *device.FingerprintResponse, error) {
	cfg := p.config()
	if !cfg.Enabled {
		return nil, device.ErrPluginDisabled
	}
	out := make(chan *device.FingerprintResponse)
	go p.fingerprintLoop(ctx, cfg.FingerprintPeriod, out)
	return out, nil
}

func (p *Plugin) fingerprintLoop(ctx context.Context, period time.Duration, out chan<- *device.FingerprintResponse) {
	defer close(out)

	var (
		last     []*device.DeviceGroup
		sent     bool
		watching []string // physical UUIDs the event watcher registered
		watch    *eventWatcher
		timer    = time.NewTimer(0)
	)
	defer timer.Stop()
	defer func() { watch.stop() }()

	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-p.notify:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}

		groups, physical := p.refresh()

		// (Re)register Xid events when the set of physical GPUs changes.
		uuids := make([]string, len(physical))
		for i, ph := range physical {
			uuids[i] = ph.UUID
		}
		if !reflect.DeepEqual(uuids, watching) {
			watch.stop()
			watch, watching = nil, uuids
			if len(physical) > 0 {
				watch = p.startWatcher(ctx, physical)
			}
		}

		if !sent || !reflect.DeepEqual(groups, last) {
			select {
			case out <- device.NewFingerprint(groups...):
			case <-ctx.Done():
				return
			}
			sent, last = true, groups
		}
		timer.Reset(period)
	}
}

// requestRefresh asks the fingerprint loop to rescan now.
func (p *Plugin) requestRefresh() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// refresh initialises NVML if needed, rescans the devices, merges health and
// returns the device groups to report plus the physical GPUs to watch.
func (p *Plugin) refresh() ([]*device.DeviceGroup, []physicalGPU) {
	p.mu.Lock()
	defer p.mu.Unlock()

	if !p.initialized {
		ret := p.lib.Init()
		if ret != nvml.SUCCESS {
			if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
				p.setUnavailableLocked("NVIDIA driver library libnvidia-ml.so.1 not found (NVML: ERROR_LIBRARY_NOT_FOUND); reporting no GPUs")
			} else {
				p.setUnavailableLocked(fmt.Sprintf("NVML initialisation failed (%v); reporting no GPUs", ret))
			}
			return nil, nil
		}
		p.initialized = true
	}

	s, err := enumerate(p.lib, p.cfg.IgnoredGPUIDs)
	if err != nil {
		// Keep what we knew, marked unhealthy: dropping GPUs on a transient
		// NVML error would make Nomad forget them.
		if msg := err.Error(); msg != p.lastScanErr {
			p.logger.Error("scanning GPUs failed", "error", err)
			p.lastScanErr = msg
		}
		return p.groupsLocked(), nil
	}
	p.lastScanErr = ""

	found := make(map[string]*gpu, len(s.gpus))
	for _, g := range s.gpus {
		found[g.ID] = g
		h := p.health[g.ID]
		switch {
		case g.lost:
			if h.lost == "" {
				p.logger.Error("GPU lost", "gpu", g.ID, "reason", lostReason)
			}
			h.lost = lostReason
			if old, ok := p.devices[g.ID]; ok {
				// What a lost GPU answers is incomplete: keep the last good view.
				g.Name, g.PCIBusID, g.Attrs = old.Name, old.PCIBusID, old.Attrs
			}
		case h.lost != "":
			// Back from lost: the GPU was reset or re-attached, which also
			// clears the fault behind any earlier critical Xid.
			p.logger.Info("GPU healthy again", "gpu", g.ID, "was", h.desc())
			h = healthState{}
		}
		p.health[g.ID] = h
	}
	for id, old := range p.devices {
		if _, ok := found[id]; ok {
			continue
		}
		if s.lostUnknown > 0 {
			h := p.health[id]
			if h.lost == "" {
				p.logger.Error("GPU lost", "gpu", id, "reason", lostReason)
			}
			h.lost = lostReason
			p.health[id] = h
			found[id] = old
			continue
		}
		delete(p.health, id)
	}
	p.devices = found

	if len(found) == 0 {
		p.setUnavailableLocked("NVML reports no NVIDIA GPUs (or all are ignored); reporting no GPUs")
	} else {
		p.setUnavailableLocked("")
	}
	return p.groupsLocked(), s.physical
}

// setUnavailableLocked logs why no GPUs are reported, once per distinct
// reason, so a GPU-less node logs it once and then stays quiet.
func (p *Plugin) setUnavailableLocked(reason string) {
	if reason == p.unavailable {
		return
	}
	p.unavailable = reason
	if reason == "" {
		p.logger.Info("GPUs detected", "count", len(p.devices))
		return
	}
	p.logger.Info(reason)
}

// groupsLocked builds one device group per model name, sorted by name, each
// with its devices sorted by id.
func (p *Plugin) groupsLocked() []*device.DeviceGroup {
	byName := map[string][]*gpu{}
	for _, g := range p.devices {
		byName[g.Name] = append(byName[g.Name], g)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)

	groups := make([]*device.DeviceGroup, 0, len(names))
	for _, n := range names {
		gs := byName[n]
		sort.Slice(gs, func(a, b int) bool { return gs[a].ID < gs[b].ID })
		devs := make([]*device.Device, len(gs))
		for i, g := range gs {
			h := p.health[g.ID]
			healthy, desc := h.healthy(), h.desc()
			if p.lastScanErr != "" {
				// Not a health change of the GPU itself, so not stored in
				// p.health: the next good scan restores the real state.
				healthy = false
				desc = strings.TrimPrefix(desc+"; NVML query failed: "+p.lastScanErr, "; ")
			}
			devs[i] = &device.Device{
				ID:         g.ID,
				Healthy:    healthy,
				HealthDesc: desc,
				HwLocality: &device.DeviceLocality{PciBusID: g.PCIBusID},
			}
		}
		groups = append(groups, &device.DeviceGroup{
			Vendor:  vendor,
			Type:    deviceType,
			Name:    n,
			Devices: devs,
			// Devices of one model share attributes; like nomad-device-nvidia
			// the group takes the first device's.
			Attributes: gs[0].Attrs,
		})
	}
	return groups
}

// markXID records a critical Xid (or double-bit ECC event) on a physical GPU.
// giID selects one MIG instance; a negative giID hits every device on the GPU.
func (p *Plugin) markXID(physical string, giID int, reason string) {
	p.mu.Lock()
	changed := false
	for id, g := range p.devices {
		if g.Physical != physical {
			continue
		}
		if giID >= 0 && g.MIG && g.GIID != giID {
			continue
		}
		h := p.health[id]
		if h.xid != reason {
			h.xid = reason
			p.health[id] = h
			changed = true
		}
	}
	p.mu.Unlock()
	if changed {
		p.logger.Error("GPU marked unhealthy", "gpu", physical, "reason", reason)
		p.requestRefresh()
	}
}

// markLost records that a query on a device returned ERROR_GPU_IS_LOST.
func (p *Plugin) markLost(id string) {
	p.mu.Lock()
	changed := false
	if h := p.health[id]; h.lost == "" {
		if _, known := p.devices[id]; known {
			h.lost = lostReason
			p.health[id] = h
			changed = true
		}
	}
	p.mu.Unlock()
	if changed {
		p.logger.Error("GPU lost", "gpu", id, "reason", lostReason)
		p.requestRefresh()
	}
}

// reservationError names the device ids Nomad asked for that the plugin does
// not know.
type reservationError struct{ unknown []string }

func (e *reservationError) Error() string {
	return "unknown device IDs: " + strings.Join(e.unknown, ",")
}

// Reserve tells Nomad how to expose the devices to a task: both the
// container runtime's and CUDA's visibility variables carry the UUIDs.
func (p *Plugin) Reserve(deviceIDs []string) (*device.ContainerReservation, error) {
	if len(deviceIDs) == 0 {
		return &device.ContainerReservation{}, nil
	}
	p.mu.Lock()
	enabled := p.cfg.Enabled
	var unknown []string
	for _, id := range deviceIDs {
		if _, ok := p.devices[id]; !ok {
			unknown = append(unknown, id)
		}
	}
	p.mu.Unlock()
	if !enabled {
		return nil, device.ErrPluginDisabled
	}
	if len(unknown) > 0 {
		return nil, &reservationError{unknown: unknown}
	}
	ids := strings.Join(deviceIDs, ",")
	return &device.ContainerReservation{
		Envs: map[string]string{
			envNvidiaVisibleDevices: ids,
			envCUDAVisibleDevices:   ids,
		},
	}, nil
}
