// Package driver is the Nomad task driver "llm": it renders an inference
// engine's command line from the task config (package render), launches it
// under a supervisor process (package nomad-driver/supervisor), watches its
// health endpoint and reports task events, and reattaches to running
// engines after a Nomad client restart. It speaks Nomad's task driver
// protocol through internal/nomadplugin.
package driver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
	"github.com/oasis-llm/oasis/nomad-driver/config"
)

const (
	// PluginName is the driver name jobs use: driver = "llm".
	PluginName = "llm"
	// PluginVersion is reported in PluginInfo.
	PluginVersion = "0.1.0"
	// taskHandleVersion versions the driver state stored in task handles.
	taskHandleVersion = 1
)

// Driver implements drivers.DriverPlugin.
type Driver struct {
	ctx     context.Context
	logger  hclog.Logger
	eventer *drivers.Eventer
	tasks   *taskStore
	probe   *prober

	mu          sync.RWMutex
	config      config.PluginConfig
	period      time.Duration
	nomadConfig *base.ClientDriverConfig
	// fingerprintNow wakes the fingerprint loop after SetConfig.
	fingerprintNow chan struct{}
	timing         healthTiming

	// supervisorBinary is the executable run in supervisor mode; empty:
	// this process's own (tests set the test binary's).
	supervisorBinary string

	// ticks is the node's compute in MHz (container stats), read once.
	ticksOnce sync.Once
	ticks     float64
}

// New returns the driver; ctx bounds its background work. A nil logger
// discards the driver's logs.
func New(ctx context.Context, logger hclog.Logger) *Driver {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	logger = logger.Named(PluginName)
	return &Driver{
		ctx:            ctx,
		logger:         logger,
		eventer:        drivers.NewEventer(ctx, logger),
		tasks:          newTaskStore(),
		probe:          newProber(),
		period:         config.DefaultFingerprintEvery,
		fingerprintNow: make(chan struct{}, 1),
		timing:         defaultHealthTiming,
	}
}

var _ drivers.DriverPlugin = (*Driver)(nil)

func (d *Driver) PluginInfo() (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{
		Type:              base.PluginTypeDriver,
		PluginApiVersions: []string{drivers.ApiVersion010},
		PluginVersion:     PluginVersion,
		Name:              PluginName,
	}, nil
}

func (d *Driver) ConfigSchema() (*hclspec.Spec, error) { return config.PluginSpec, nil }

func (d *Driver) TaskConfigSchema() (*hclspec.Spec, error) { return config.TaskSpec, nil }

// SetConfig keeps the plugin config and the agent's driver config.
func (d *Driver) SetConfig(cfg *base.Config) error {
	var pc config.PluginConfig
	if len(cfg.PluginConfig) != 0 {
		if err := base.MsgPackDecode(cfg.PluginConfig, &pc); err != nil {
			return fmt.Errorf("decoding plugin config: %w", err)
		}
	}
	period, err := pc.Validate()
	if err != nil {
		return fmt.Errorf("plugin \"nomad-driver-llm\" config: %w", err)
	}
	d.mu.Lock()
	d.config, d.period = pc, period
	if cfg.AgentConfig != nil {
		d.nomadConfig = cfg.AgentConfig.Driver
	}
	d.mu.Unlock()
	select {
	case d.fingerprintNow <- struct{}{}:
	default:
	}
	return nil
}

func (d *Driver) pluginConfig() (config.PluginConfig, *base.ClientDriverConfig) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.config, d.nomadConfig
}

func (d *Driver) Capabilities() (*drivers.Capabilities, error) {
	return &drivers.Capabilities{
		SendSignals: true,
		Exec:        true,
		FSIsolation: drivers.FSIsolationNone,
		// In group isolation (bridge) the supervisor starts the engine inside
		// the allocation's namespace and the renderer binds the mapped "to"
		// ports there, as Nomad's exec and raw_exec drivers allow.
		NetIsolationModes: []drivers.NetIsolationMode{drivers.NetIsolationModeHost, drivers.NetIsolationModeGroup},
		MountConfigs:      drivers.MountConfigSupportNone,
	}, nil
}

func (d *Driver) TaskEvents(ctx context.Context) (<-chan *drivers.TaskEvent, error) {
	return d.eventer.TaskEvents(ctx)
}

// emit sends a task event; Nomad shows Message in the task's event list.
func (d *Driver) emit(tc *drivers.TaskConfig, msg string, annotations map[string]string) {
	if err := d.eventer.EmitEvent(&drivers.TaskEvent{
		TaskID:      tc.ID,
		TaskName:    tc.Name,
		AllocID:     tc.AllocID,
		Timestamp:   time.Now(),
		Message:     msg,
		Annotations: annotations,
	}); err != nil {
		d.logger.Warn("emitting task event", "task_id", tc.ID, "error", err)
	}
}
