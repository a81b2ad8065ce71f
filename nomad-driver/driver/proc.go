package driver

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/nomad-driver/render"
	"github.com/oasis-llm/oasis/nomad-driver/supervisor"
)

const (
	// launchTimeout bounds starting the supervisor and the engine's exec.
	launchTimeout = 30 * time.Second
	// reattachTimeout bounds reaching a running supervisor at RecoverTask.
	reattachTimeout = 15 * time.Second
	// shutdownSlack is how long a stop may take beyond its grace period
	// (the SIGKILL and the supervisor's answer).
	shutdownSlack = 15 * time.Second
)

// supervisorConfig is how the driver starts or reaches a task's
// supervisor: this binary in supervisor mode, logging into the task
// directory.
func (d *Driver) supervisorConfig(tc *drivers.TaskConfig, logger hclog.Logger) supervisor.Config {
	cfg := supervisor.Config{Logger: logger.Named("supervisor"), Binary: d.supervisorBinary}
	if tc != nil && tc.AllocDir != "" {
		cfg.LogFile = filepath.Join(tc.TaskDir().Dir, "supervisor.log")
	}
	return cfg
}

// launch starts the engine of a rendered plan under a new supervisor: in
// the task directory, as runAs, with the task's environment and the plan's
// variables on top, its output into the task's log FIFOs, inside the
// allocation's network namespace in bridge mode.
func (d *Driver) launch(cfg *drivers.TaskConfig, plan *render.Plan, runAs string, logger hclog.Logger) (*supervisor.Handle, error) {
	env := make(map[string]string, len(cfg.Env)+len(plan.Env))
	for k, v := range cfg.Env {
		env[k] = v
	}
	for k, v := range plan.Env {
		env[k] = v
	}
	envList := make([]string, 0, len(env))
	for k, v := range env {
		envList = append(envList, k+"="+v)
	}
	slices.Sort(envList)
	ctx, cancel := context.WithTimeout(d.ctx, launchTimeout)
	defer cancel()
	proc, err := supervisor.Launch(ctx, d.supervisorConfig(cfg, logger), supervisor.Command{
		Path:       plan.Argv[0],
		Args:       plan.Argv[1:],
		Env:        envList,
		Dir:        cfg.TaskDir().Dir,
		User:       runAs,
		StdoutPath: cfg.StdoutPath,
		StderrPath: cfg.StderrPath,
		NetNS:      netNSPath(cfg),
	})
	if err != nil {
		return nil, fmt.Errorf("launching %s: %w", plan.Argv[0], err)
	}
	return proc, nil
}
