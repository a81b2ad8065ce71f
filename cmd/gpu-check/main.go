// Command gpu-check runs the built nomad-device-gpu plugin the way a Nomad
// client does (go-plugin handshake, gRPC, Nomad's device plugin protocol) and
// prints what a Nomad client would receive: the fingerprint and two stats
// samples, against the machine's real NVML.
//
//	go run ./cmd/gpu-check                      # builds ./cmd/nomad-device-gpu first
//	go run ./cmd/gpu-check -plugin bin/nomad-device-gpu -interval 2s
//
// It exits non-zero when the plugin reports no GPU (unless -allow-empty) or
// any call fails.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/device-plugin/pluginclient"
	"github.com/oasis-llm/oasis/internal/nomadplugin/device"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

type options struct {
	plugin     string
	interval   time.Duration
	samples    int
	timeout    time.Duration
	allowEmpty bool
	jsonOut    bool
	config     map[string]any
}

func main() {
	var (
		o       options
		cfgJSON string
	)
	flag.StringVar(&o.plugin, "plugin", "", "plugin binary (default: go build ./cmd/nomad-device-gpu into a temp dir)")
	flag.DurationVar(&o.interval, "interval", time.Second, "stats interval")
	flag.IntVar(&o.samples, "samples", 2, "stats samples to print")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "overall deadline")
	flag.BoolVar(&o.allowEmpty, "allow-empty", false, "succeed when the plugin reports no GPUs")
	flag.BoolVar(&o.jsonOut, "json", false, "also print the raw fingerprint and stats as JSON")
	flag.StringVar(&cfgJSON, "config", "", `plugin config as JSON, e.g. {"ignored_gpu_ids":["GPU-..."]}`)
	flag.Parse()
	if cfgJSON != "" {
		if err := json.Unmarshal([]byte(cfgJSON), &o.config); err != nil {
			fmt.Fprintf(os.Stderr, "gpu-check: -config: %v\n", err)
			os.Exit(2)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := run(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "gpu-check: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, stdout, stderr io.Writer) error {
	if o.plugin == "" {
		dir, err := os.MkdirTemp("", "gpu-check-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		o.plugin = filepath.Join(dir, "nomad-device-gpu")
		build := exec.CommandContext(ctx, "go", "build", "-o", o.plugin, "./cmd/nomad-device-gpu")
		build.Stdout, build.Stderr = stderr, stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building the plugin (run from the repository root): %w", err)
		}
	}

	logger := hclog.New(&hclog.LoggerOptions{Name: "gpu-check", Level: hclog.Info, Output: stderr})
	c, err := pluginclient.Launch(ctx, o.plugin, o.config, logger)
	if err != nil {
		return fmt.Errorf("launching %s: %w", o.plugin, err)
	}
	defer c.Close()
	fmt.Fprintf(stdout, "plugin %s %s (%s), pid %d\n", c.Info.Name, c.Info.PluginVersion, o.plugin, c.Pid())

	fctx, stopFP := context.WithCancel(ctx)
	defer stopFP()
	fch, err := c.Device.Fingerprint(fctx)
	if err != nil {
		return fmt.Errorf("fingerprint: %w", err)
	}
	var fp *device.FingerprintResponse
	select {
	case fp = <-fch:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the fingerprint: %w", ctx.Err())
	}
	if fp == nil {
		return errors.New("fingerprint stream closed without a fingerprint")
	}
	if fp.Error != nil {
		return fmt.Errorf("fingerprint: %w", fp.Error)
	}
	printFingerprint(stdout, fp)
	if o.jsonOut {
		printJSON(stdout, "fingerprint", fp.Devices)
	}
	n := 0
	for _, g := range fp.Devices {
		n += len(g.Devices)
	}
	if n == 0 && !o.allowEmpty {
		return errors.New("the plugin reports no GPUs (see its log above for why)")
	}

	sch, err := c.Device.Stats(ctx, o.interval)
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	for i := 1; i <= o.samples; i++ {
		var s *device.StatsResponse
		select {
		case s = <-sch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for stats sample %d: %w", i, ctx.Err())
		}
		if s == nil {
			return errors.New("stats stream closed")
		}
		if s.Error != nil {
			return fmt.Errorf("stats sample %d: %w", i, s.Error)
		}
		printStats(stdout, i, s)
		if o.jsonOut {
			printJSON(stdout, fmt.Sprintf("stats sample %d", i), s.Groups)
		}
	}
	if c.Exited() {
		return errors.New("plugin exited")
	}
	return nil
}

func printFingerprint(w io.Writer, fp *device.FingerprintResponse) {
	fmt.Fprintf(w, "\nfingerprint: %d device group(s)\n", len(fp.Devices))
	for _, g := range fp.Devices {
		fmt.Fprintf(w, "  %s/%s %q\n", g.Vendor, g.Type, g.Name)
		keys := make([]string, 0, len(g.Attributes))
		for k := range g.Attributes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "    attr %-20s %s\n", k, attrString(g.Attributes[k]))
		}
		for _, d := range g.Devices {
			health := "healthy"
			if !d.Healthy {
				health = "UNHEALTHY: " + d.HealthDesc
			}
			bus := ""
			if d.HwLocality != nil {
				bus = d.HwLocality.PciBusID
			}
			fmt.Fprintf(w, "    device %s  pci %s  %s\n", d.ID, bus, health)
		}
	}
}

func printStats(w io.Writer, i int, s *device.StatsResponse) {
	fmt.Fprintf(w, "\nstats sample %d:\n", i)
	if len(s.Groups) == 0 {
		fmt.Fprintln(w, "  (no devices)")
	}
	for _, g := range s.Groups {
		ids := make([]string, 0, len(g.InstanceStats))
		for id := range g.InstanceStats {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			st := g.InstanceStats[id]
			fmt.Fprintf(w, "  %s (%s) at %s  summary %s\n", id, g.Name, st.Timestamp.Format(time.RFC3339Nano), statString(st.Summary))
			if st.Stats == nil {
				continue
			}
			keys := make([]string, 0, len(st.Stats.Attributes))
			for k := range st.Stats.Attributes {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(w, "    %-22s %s\n", k, statString(st.Stats.Attributes[k]))
			}
		}
	}
}

// attrString renders an attribute as Nomad's CLI does: the value, the unit
// right after it ("40960MiB").
func attrString(a *structs.Attribute) string {
	var s string
	switch {
	case a == nil:
		return "<nil>"
	case a.Float != nil:
		s = fmt.Sprintf("%v", *a.Float)
	case a.Int != nil:
		s = fmt.Sprintf("%d", *a.Int)
	case a.Bool != nil:
		s = fmt.Sprintf("%t", *a.Bool)
	case a.String != nil:
		s = *a.String
	}
	return strings.TrimSpace(s + a.Unit)
}

func statString(v *structs.StatValue) string {
	if v == nil {
		return "<nil>"
	}
	var s string
	switch {
	case v.StringVal != nil:
		s = *v.StringVal
	case v.FloatNumeratorVal != nil && v.FloatDenominatorVal != nil:
		s = fmt.Sprintf("%.3f / %.3f", *v.FloatNumeratorVal, *v.FloatDenominatorVal)
	case v.FloatNumeratorVal != nil:
		s = fmt.Sprintf("%.3f", *v.FloatNumeratorVal)
	case v.IntNumeratorVal != nil && v.IntDenominatorVal != nil:
		s = fmt.Sprintf("%d / %d", *v.IntNumeratorVal, *v.IntDenominatorVal)
	case v.IntNumeratorVal != nil:
		s = fmt.Sprintf("%d", *v.IntNumeratorVal)
	case v.BoolVal != nil:
		s = fmt.Sprintf("%t", *v.BoolVal)
	}
	if v.Unit != "" {
		s += " " + v.Unit
	}
	return s
}

func printJSON(w io.Writer, label string, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		fmt.Fprintf(w, "%s: encoding JSON: %v\n", label, err)
		return
	}
	fmt.Fprintf(w, "\n%s (JSON):\n%s\n", label, b)
}
