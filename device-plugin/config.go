package deviceplugin

import (
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

// Defaults of the plugin block. fingerprint_period matches nomad-device-nvidia.
const (
	defaultFingerprintPeriod = time.Minute
)

// configSpec is the plugin block schema. It accepts every key of
// nomad-device-nvidia except the `mps` block, so an existing
// `plugin "..." { config { ... } }` block keeps parsing.
var configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"enabled": hclspec.NewDefault(
		hclspec.NewAttr("enabled", "bool", false),
		hclspec.NewLiteral("true"),
	),
	"ignored_gpu_ids": hclspec.NewDefault(
		hclspec.NewAttr("ignored_gpu_ids", "list(string)", false),
		hclspec.NewLiteral("[]"),
	),
	"fingerprint_period": hclspec.NewDefault(
		hclspec.NewAttr("fingerprint_period", "string", false),
		hclspec.NewLiteral(`"1m"`),
	),
	// Empty means: use the interval Nomad asks for (the client's
	// collection interval).
	"stats_period": hclspec.NewDefault(
		hclspec.NewAttr("stats_period", "string", false),
		hclspec.NewLiteral(`""`),
	),
})

// rawConfig is the msgpack form Nomad sends in SetConfig.
type rawConfig struct {
	Enabled           bool     `codec:"enabled"`
	IgnoredGPUIDs     []string `codec:"ignored_gpu_ids"`
	FingerprintPeriod string   `codec:"fingerprint_period"`
	StatsPeriod       string   `codec:"stats_period"`
}

// Config is the validated plugin configuration.
type Config struct {
	Enabled           bool
	IgnoredGPUIDs     map[string]struct{}
	FingerprintPeriod time.Duration
	// StatsPeriod overrides Nomad's stats interval when non-zero.
	StatsPeriod time.Duration
}

// DefaultConfig is what the plugin runs with before SetConfig is called.
func DefaultConfig() Config {
	return Config{
		Enabled:           true,
		IgnoredGPUIDs:     map[string]struct{}{},
		FingerprintPeriod: defaultFingerprintPeriod,
	}
}

// decodeConfig turns Nomad's msgpack plugin config into a Config. An empty
// buffer yields the defaults (Nomad sends none when the block has no config).
func decodeConfig(buf []byte) (Config, error) {
	cfg := DefaultConfig()
	if len(buf) == 0 {
		return cfg, nil
	}
	raw := rawConfig{Enabled: true}
	if err := base.MsgPackDecode(buf, &raw); err != nil {
		return Config{}, fmt.Errorf("decoding plugin config: %w", err)
	}
	cfg.Enabled = raw.Enabled
	for _, id := range raw.IgnoredGPUIDs {
		cfg.IgnoredGPUIDs[id] = struct{}{}
	}
	if raw.FingerprintPeriod != "" {
		d, err := time.ParseDuration(raw.FingerprintPeriod)
		if err != nil {
			return Config{}, fmt.Errorf("fingerprint_period %q: %w", raw.FingerprintPeriod, err)
		}
		if d <= 0 {
			return Config{}, fmt.Errorf("fingerprint_period %q: must be positive", raw.FingerprintPeriod)
		}
		cfg.FingerprintPeriod = d
	}
	if raw.StatsPeriod != "" {
		d, err := time.ParseDuration(raw.StatsPeriod)
		if err != nil {
			return Config{}, fmt.Errorf("stats_period %q: %w", raw.StatsPeriod, err)
		}
		if d <= 0 {
			return Config{}, fmt.Errorf("stats_period %q: must be positive", raw.StatsPeriod)
		}
		cfg.StatsPeriod = d
	}
	return cfg, nil
}
