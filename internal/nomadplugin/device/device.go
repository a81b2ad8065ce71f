// Package device is Oasis's implementation of Nomad's device plugin
// protocol (v0.1.0): the Go types a device plugin works with, their
// conversion to and from the wire messages of
// internal/nomadplugin/proto/device, and the go-plugin glue that serves a
// DevicePlugin to a Nomad client (PluginDevice, Serve) or drives a plugin
// process from Go (PluginDevice's client side).
//
// The types are named as in Nomad's plugins/device package so a plugin
// written against Nomad's SDK ports by changing imports.
package device

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

const (
	// ApiVersion010 is the device plugin protocol version this package
	// speaks; a plugin lists it in PluginInfoResponse.PluginApiVersions.
	ApiVersion010 = "v0.1.0" //nolint:revive // Nomad's name

	// DeviceTypeGPU is the canonical device type of a GPU.
	DeviceTypeGPU = "gpu"
)

var (
	// ErrPluginDisabled is what a disabled plugin returns from Fingerprint,
	// Reserve and Stats.
	ErrPluginDisabled = errors.New("device is not enabled")

	// ErrPluginShutdown is what the client side returns when the plugin
	// process went away during a call or stream.
	ErrPluginShutdown = errors.New("plugin is shut down")
)

// DevicePlugin is a plugin that reports devices to Nomad, tells it how to
// expose them to tasks and reports their statistics.
type DevicePlugin interface {
	base.BasePlugin

	// Fingerprint streams the detected device groups until ctx ends. A
	// response carrying Error ends the stream.
	Fingerprint(ctx context.Context) (<-chan *FingerprintResponse, error)

	// Reserve returns how to expose the given devices to a task.
	Reserve(deviceIDs []string) (*ContainerReservation, error)

	// Stats streams the devices' statistics every interval until ctx ends.
	Stats(ctx context.Context, interval time.Duration) (<-chan *StatsResponse, error)
}

// FingerprintResponse is one fingerprint: the device groups, or an error.
type FingerprintResponse struct {
	Devices []*DeviceGroup
	Error   error
}

// NewFingerprint returns a fingerprint of groups.
func NewFingerprint(groups ...*DeviceGroup) *FingerprintResponse {
	return &FingerprintResponse{Devices: groups}
}

// NewFingerprintError returns a fingerprint carrying err.
func NewFingerprintError(err error) *FingerprintResponse {
	return &FingerprintResponse{Error: err}
}

// DeviceGroup is a set of devices that share vendor, type and model name,
// and the attributes they have in common.
type DeviceGroup struct {
	Vendor     string
	Type       string
	Name       string
	Devices    []*Device
	Attributes map[string]*structs.Attribute
}

// Validate reports what Nomad's client would refuse in the group, every
// problem naming its field.
func (g *DeviceGroup) Validate() error {
	var errs []error
	if g.Vendor == "" {
		errs = append(errs, errors.New("device vendor must be specified"))
	}
	if g.Type == "" {
		errs = append(errs, errors.New("device type must be specified"))
	}
	if g.Name == "" {
		errs = append(errs, errors.New("device name must be specified"))
	}
	for i, d := range g.Devices {
		if d == nil {
			errs = append(errs, fmt.Errorf("device %d is nil", i))
			continue
		}
		if err := d.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("device %d: %w", i, err))
		}
	}
	for k, v := range g.Attributes {
		if err := validateAttribute(v); err != nil {
			errs = append(errs, fmt.Errorf("device attribute %q invalid: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// knownUnit reports whether Nomad's client accepts unit on a device
// attribute; it refuses a fingerprint (and stops the plugin) with any other.
func knownUnit(unit string) bool {
	switch unit {
	case "KiB", "MiB", "GiB", "TiB", "PiB", "EiB",
		"kB", "KB", "MB", "GB", "TB", "PB", "EB",
		"KiB/s", "MiB/s", "GiB/s", "TiB/s", "PiB/s", "EiB/s",
		"kB/s", "KB/s", "MB/s", "GB/s", "TB/s", "PB/s", "EB/s",
		"MHz", "GHz",
		"mW", "W", "kW", "MW", "GW":
		return true
	}
	return false
}

// validateAttribute checks an attribute as Nomad's client does: exactly one
// value, and a unit only on a number and only a unit Nomad knows.
func validateAttribute(a *structs.Attribute) error {
	if a == nil {
		return errors.New("attribute is nil")
	}
	if a.Unit != "" {
		if !knownUnit(a.Unit) {
			return fmt.Errorf("unrecognized unit %q", a.Unit)
		}
		if a.String != nil || a.Bool != nil {
			return errors.New("unit can not be specified on a boolean or string attribute")
		}
	}
	n := 0
	for _, set := range []bool{a.Float != nil, a.Int != nil, a.String != nil, a.Bool != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("attribute must hold exactly one value, holds %d", n)
	}
	return nil
}

// Device is one device of a group.
type Device struct {
	// ID identifies the device; it must be stable across plugin restarts.
	ID string
	// Healthy devices can be scheduled; HealthDesc says why one is not.
	Healthy    bool
	HealthDesc string
	// HwLocality places the device for NUMA-aware scheduling; optional.
	HwLocality *DeviceLocality
}

// Validate checks that the device has an id.
func (d *Device) Validate() error {
	if d.ID == "" {
		return errors.New("device ID must be specified")
	}
	return nil
}

// DeviceLocality is where a device sits in the host's hardware.
type DeviceLocality struct {
	PciBusID string
}

// ContainerReservation is how a task gets its devices: environment
// variables, host paths to mount and device nodes.
type ContainerReservation struct {
	Envs    map[string]string
	Mounts  []*Mount
	Devices []*DeviceSpec
}

// Mount is a host path mounted into a task.
type Mount struct {
	TaskPath string
	HostPath string
	ReadOnly bool
}

// DeviceSpec is a host device node exposed to a task.
type DeviceSpec struct {
	TaskPath string
	HostPath string
	// CgroupPerms is any of r, w, m.
	CgroupPerms string
}

// StatsResponse is one statistics sample of every device group, or an
// error.
type StatsResponse struct {
	Groups []*DeviceGroupStats
	Error  error
}

// NewStatsError returns a stats response carrying err.
func NewStatsError(err error) *StatsResponse {
	return &StatsResponse{Error: err}
}

// DeviceGroupStats holds the statistics of a group's devices.
type DeviceGroupStats struct {
	Vendor string
	Type   string
	Name   string
	// InstanceStats is by device id.
	InstanceStats map[string]*DeviceStats
}

// DeviceStats is one device's statistics sample.
type DeviceStats struct {
	// Summary is the one value a user should see first.
	Summary   *structs.StatValue
	Stats     *structs.StatObject
	Timestamp time.Time
}
