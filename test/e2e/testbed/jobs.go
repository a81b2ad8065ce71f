package testbed

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
)

// Main starts one stack for a test package, runs its tests, and tears the stack down on success,
// failure or interrupt. Use it from TestMain:
//
//	var stack *testbed.Stack
//	func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }
func Main(m *testing.M, opts Options, stack **Stack) int {
	if opts.Logf == nil {
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	s, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed: starting Nomad + Consul: %v\n", err)
		return 1
	}
	*stack = s

	// An interrupted run still tears down: no agent, task or cgroup outlives it.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig, ok := <-sigs
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "testbed: %s: tearing down\n", sig)
		if err := s.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "testbed: teardown: %v\n", err)
		}
		os.Exit(1)
	}()

	code := m.Run()
	signal.Stop(sigs)
	close(sigs)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "testbed: nomad log tail:\n%s\n", s.NomadLog())
	}
	if err := s.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "testbed: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// ParseJobHCL turns a jobspec into an API job, parsed by the agent itself (so HCL2 variables,
// functions and the plugins' config schemas are handled exactly as `nomad job run` does).
func (s *Stack) ParseJobHCL(hcl string) (*nomadapi.Job, error) {
	job, err := s.Nomad.Jobs().ParseHCL(hcl, true)
	if err != nil {
		return nil, fmt.Errorf("parsing job: %w", err)
	}
	return job, nil
}

// RunJobHCL parses and registers a job.
func (s *Stack) RunJobHCL(ctx context.Context, hcl string) (*nomadapi.Job, error) {
	job, err := s.ParseJobHCL(hcl)
	if err != nil {
		return nil, err
	}
	if _, _, err := s.Nomad.Jobs().Register(job, (&nomadapi.WriteOptions{}).WithContext(ctx)); err != nil {
		return nil, fmt.Errorf("registering job %s: %w", *job.ID, err)
	}
	return job, nil
}

// WaitAllocsRunning waits until the job has at least one allocation and every non-terminal
// allocation of its latest version is running. A failed allocation ends the wait with an error
// carrying its task events.
func (s *Stack) WaitAllocsRunning(ctx context.Context, jobID string) ([]*nomadapi.AllocationListStub, error) {
	var running []*nomadapi.AllocationListStub
	err := poll(ctx, 200*time.Millisecond, "allocations of "+jobID+" running", func() (bool, error) {
		allocs, _, err := s.Nomad.Jobs().Allocations(jobID, false, nil)
		if err != nil {
			return false, err
		}
		running = running[:0]
		pending := 0
		for _, a := range allocs {
			switch a.ClientStatus {
			case "running":
				running = append(running, a)
			case "failed", "lost":
				return false, permanentError{fmt.Errorf("allocation %s of %s is %s: %s", a.ID[:8], jobID, a.ClientStatus, describeTasks(a))}
			case "complete":
			default:
				pending++
			}
		}
		return len(running) > 0 && pending == 0, nil
	})
	if err != nil {
		return nil, err
	}
	return running, nil
}

// WaitDeployment waits until the job's latest deployment succeeded (Nomad refuses to scale a
// job while a deployment runs); a failed or cancelled deployment ends the wait with its status.
func (s *Stack) WaitDeployment(ctx context.Context, jobID string) error {
	return poll(ctx, 500*time.Millisecond, "deployment of "+jobID+" to succeed", func() (bool, error) {
		d, _, err := s.Nomad.Jobs().LatestDeployment(jobID, (&nomadapi.QueryOptions{}).WithContext(ctx))
		if err != nil || d == nil {
			return false, err
		}
		switch d.Status {
		case nomadapi.DeploymentStatusFailed, nomadapi.DeploymentStatusCancelled:
			return false, permanentError{fmt.Errorf("deployment %s of %s is %s: %s", d.ID[:8], jobID, d.Status, d.StatusDescription)}
		}
		return d.Status == nomadapi.DeploymentStatusSuccessful, nil
	})
}

// WaitJobDone waits until every allocation of a batch job has finished and returns them.
func (s *Stack) WaitJobDone(ctx context.Context, jobID string) ([]*nomadapi.AllocationListStub, error) {
	var done []*nomadapi.AllocationListStub
	err := poll(ctx, 200*time.Millisecond, "allocations of "+jobID+" done", func() (bool, error) {
		allocs, _, err := s.Nomad.Jobs().Allocations(jobID, false, nil)
		if err != nil {
			return false, err
		}
		for _, a := range allocs {
			if a.ClientStatus != "complete" && a.ClientStatus != "failed" && a.ClientStatus != "lost" {
				return false, nil
			}
		}
		done = allocs
		return len(allocs) > 0, nil
	})
	return done, err
}

// StopJob deregisters and purges a job and waits until its allocations are terminal, so the
// caller can assert that its processes are gone.
func (s *Stack) StopJob(ctx context.Context, jobID string) error {
	allocs, _, err := s.Nomad.Jobs().Allocations(jobID, true, nil)
	if err != nil {
		return fmt.Errorf("listing allocations of %s: %w", jobID, err)
	}
	if _, _, err := s.Nomad.Jobs().Deregister(jobID, true, (&nomadapi.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("stopping job %s: %w", jobID, err)
	}
	ids := make([]string, len(allocs))
	for i, a := range allocs {
		ids[i] = a.ID
	}
	timeout := 60 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	return s.waitAllocsTerminal(ids, timeout)
}

// TaskLog returns what a task wrote to stdout or stderr ("stdout" / "stderr").
func (s *Stack) TaskLog(ctx context.Context, allocID, task, stream string) (string, error) {
	alloc, _, err := s.Nomad.Allocations().Info(allocID, nil)
	if err != nil {
		return "", fmt.Errorf("reading allocation %s: %w", allocID, err)
	}
	cancel := make(chan struct{})
	defer close(cancel)
	frames, errs := s.Nomad.AllocFS().Logs(alloc, false, task, stream, "start", 0, cancel, (&nomadapi.QueryOptions{}).WithContext(ctx))
	var b strings.Builder
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				return b.String(), nil
			}
			if f != nil {
				b.Write(f.Data)
			}
		case err := <-errs:
			if err != nil {
				return b.String(), fmt.Errorf("reading %s of %s: %w", stream, task, err)
			}
		case <-ctx.Done():
			return b.String(), ctx.Err()
		}
	}
}

func describeTasks(a *nomadapi.AllocationListStub) string {
	var b strings.Builder
	for name, st := range a.TaskStates {
		fmt.Fprintf(&b, "[task %s %s:", name, st.State)
		for _, e := range st.Events {
			msg := e.DisplayMessage
			if msg == "" {
				msg = e.Message
			}
			fmt.Fprintf(&b, " %s(%s)", e.Type, msg)
		}
		b.WriteString("] ")
	}
	return b.String()
}

// WaitServicePassing waits until at least n instances of a Consul service pass all their checks,
// and returns them.
func (s *Stack) WaitServicePassing(ctx context.Context, name string, n int) ([]*consulapi.ServiceEntry, error) {
	var entries []*consulapi.ServiceEntry
	err := poll(ctx, 200*time.Millisecond, fmt.Sprintf("%d passing instances of %s", n, name), func() (bool, error) {
		var err error
		entries, _, err = s.Consul.Health().Service(name, "", true, (&consulapi.QueryOptions{}).WithContext(ctx))
		return err == nil && len(entries) >= n, err
	})
	return entries, err
}

var declaredVariable = regexp.MustCompile(`(?m)^\s*variable\s+"([A-Za-z0-9_-]+)"`)

// RunJobFile submits a jobspec file the way `nomad job run -var name=value ...` does, passing only
// the variables the file declares (values starting with "[" are lists, numbers stay numbers), and
// waits until its allocations run and its Consul services pass their checks.
func (s *Stack) RunJobFile(ctx context.Context, path string, vars map[string]string) error {
	job, err := s.ParseJobFile(path, vars)
	if err != nil {
		return err
	}
	if _, _, err := s.Nomad.Jobs().Register(job, nil); err != nil {
		return fmt.Errorf("registering: %w", err)
	}
	return s.waitJobServing(ctx, job)
}

// ParseJobFile parses a jobspec file as `nomad job run -var name=value ...` would, passing only
// the variables the file declares (values starting with "[" are lists, numbers stay numbers).
func (s *Stack) ParseJobFile(path string, vars map[string]string) (*nomadapi.Job, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var assigns []string
	for _, m := range declaredVariable.FindAllStringSubmatch(string(src), -1) {
		if v, ok := vars[m[1]]; ok {
			if !strings.HasPrefix(v, "[") && !isNumber(v) {
				v = fmt.Sprintf("%q", v)
			}
			assigns = append(assigns, fmt.Sprintf("%s = %s", m[1], v))
		}
	}
	job, err := s.Nomad.Jobs().ParseHCLOpts(&nomadapi.JobsParseRequest{
		JobHCL:       string(src),
		Variables:    strings.Join(assigns, "\n"),
		Canonicalize: true,
	})
	if err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	return job, nil
}

// waitJobServing waits until the job's allocations run and its Consul services pass.
func (s *Stack) waitJobServing(ctx context.Context, job *nomadapi.Job) error {
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := s.WaitAllocsRunning(wctx, *job.ID); err != nil {
		return err
	}
	// Running is not serving: wait until Consul sees each of the job's services pass its checks.
	for _, tg := range job.TaskGroups {
		for _, svc := range tg.Services {
			if svc.Provider != "" && svc.Provider != "consul" {
				continue
			}
			if _, err := s.WaitServicePassing(wctx, svc.Name, 1); err != nil {
				return err
			}
		}
	}
	return nil
}

func isNumber(v string) bool {
	_, err := strconv.ParseFloat(v, 64)
	return err == nil
}
