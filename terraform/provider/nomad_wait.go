package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
)

// engineService is the Consul service every engine registers as.
const engineService = "oasis-engine"

// pollEvery is how often the waits below look again.
const pollEvery = time.Second

// isNotFound reports whether a Nomad API error is a 404.
func isNotFound(err error) bool {
	var ur nomadapi.UnexpectedResponseError
	if errors.As(err, &ur) {
		return ur.StatusCode() == http.StatusNotFound
	}
	var urp *nomadapi.UnexpectedResponseError
	return errors.As(err, &urp) && urp.StatusCode() == http.StatusNotFound
}

// modelInstances counts the model's oasis-engine instances in Consul; with
// passing, only those passing every check.
func modelInstances(ctx context.Context, c *consulapi.Client, name string, passing bool) (int, error) {
	q := (&consulapi.QueryOptions{Filter: fmt.Sprintf("Service.Meta.oasis_model == %q", name)}).WithContext(ctx)
	entries, _, err := c.Health().Service(engineService, "", passing, q)
	if err != nil {
		return 0, fmt.Errorf("listing %s instances of model %s in Consul: %w", engineService, name, err)
	}
	return len(entries), nil
}

// waitHealthy waits until want instances of the model pass in Consul. On
// timeout the error lists the job's allocations and their tasks' states.
func waitHealthy(ctx context.Context, c *Clients, name string, want int, jobQ *nomadapi.QueryOptions, jobID string) (int, error) {
	var got int
	var lastErr error
	for {
		got, lastErr = modelInstances(ctx, c.Consul, name, true)
		if lastErr == nil && got >= want {
			return got, nil
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			desc := describeAllocs(dctx, c.Nomad, jobID, jobQ)
			if lastErr != nil {
				return got, fmt.Errorf("waiting for %d passing %s instances of model %s: %w (last error: %v); allocations: %s",
					want, engineService, name, ctx.Err(), lastErr, desc)
			}
			return got, fmt.Errorf("waiting for %d passing %s instances of model %s: %w with %d passing; allocations: %s",
				want, engineService, name, ctx.Err(), got, desc)
		case <-time.After(pollEvery):
		}
	}
}

// describeAllocs summarises a job's allocations and their tasks' states
// for an error message.
func describeAllocs(ctx context.Context, n *nomadapi.Client, jobID string, q *nomadapi.QueryOptions) string {
	allocs, _, err := n.Jobs().Allocations(jobID, false, q.WithContext(ctx))
	if err != nil {
		return fmt.Sprintf("(listing allocations: %v)", err)
	}
	if len(allocs) == 0 {
		return "none placed (see `nomad job status " + jobID + "` for the evaluation's placement failures)"
	}
	var parts []string
	for _, a := range allocs {
		parts = append(parts, fmt.Sprintf("%s %s/%s [%s]", shortID(a.ID), a.TaskGroup, a.ClientStatus, describeTasks(a.TaskStates)))
	}
	return strings.Join(parts, ", ")
}

// describeTasks lists each task's state and its most telling event.
func describeTasks(states map[string]*nomadapi.TaskState) string {
	var tasks []string
	for name, ts := range states {
		s := name + "=" + ts.State
		if ts.Failed {
			s += " (failed)"
		}
		if ev := telling(ts.Events); ev != nil {
			s += ": " + ev.Type
			if msg := ev.DisplayMessage; msg != "" {
				s += ": " + msg
			}
		}
		tasks = append(tasks, s)
	}
	sort.Strings(tasks)
	return strings.Join(tasks, "; ")
}

// telling picks the task event that says most about a failure: the last
// driver error, else the last event that failed the task, else the last.
func telling(events []*nomadapi.TaskEvent) *nomadapi.TaskEvent {
	for _, pick := range []func(*nomadapi.TaskEvent) bool{
		func(ev *nomadapi.TaskEvent) bool {
			return ev.DriverError != "" || ev.Type == nomadapi.TaskDriverFailure
		},
		func(ev *nomadapi.TaskEvent) bool { return ev.FailsTask || ev.Type == nomadapi.TaskTerminated },
		func(*nomadapi.TaskEvent) bool { return true },
	} {
		for i := len(events) - 1; i >= 0; i-- {
			if pick(events[i]) {
				return events[i]
			}
		}
	}
	return nil
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// terminal reports whether an allocation's client status is final.
func terminal(status string) bool {
	switch status {
	case nomadapi.AllocClientStatusComplete, nomadapi.AllocClientStatusFailed, nomadapi.AllocClientStatusLost:
		return true
	}
	return false
}

// waitAllocsStopped waits until every given allocation is terminal on its
// client (or gone).
func waitAllocsStopped(ctx context.Context, n *nomadapi.Client, ids []string, q *nomadapi.QueryOptions) error {
	for _, id := range ids {
		for {
			a, _, err := n.Allocations().Info(id, q.WithContext(ctx))
			if err != nil && isNotFound(err) {
				break
			}
			if err == nil && terminal(a.ClientStatus) {
				break
			}
			select {
			case <-ctx.Done():
				state := ""
				if a != nil {
					state = fmt.Sprintf(" (client status %s, desired %s, tasks: %s)", a.ClientStatus, a.DesiredStatus, describeTasks(a.TaskStates))
				}
				return fmt.Errorf("waiting for allocation %s to stop%s: %w", shortID(id), state, ctx.Err())
			case <-time.After(pollEvery):
			}
		}
	}
	return nil
}

// stopJob stops a job, waits until its allocations have stopped, then
// purges it. A service job is first scaled to zero: stopping a job with
// several groups during an active deployment can leave one group's
// allocations running (seen with Nomad 1.11; hashicorp/nomad#18467
// describes the like). Purging at once would not do either: the servers
// forget a purged job's allocations before their clients have stopped
// them. A job already gone is not an error.
func stopJob(ctx context.Context, n *nomadapi.Client, jobID, region, namespace string) error {
	q := &nomadapi.QueryOptions{Region: region, Namespace: namespace}
	w := &nomadapi.WriteOptions{Region: region, Namespace: namespace}
	job, _, err := n.Jobs().Info(jobID, q.WithContext(ctx))
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading job %s: %w", jobID, err)
	}
	if deref(job.Type) == nomadapi.JobTypeService && !(job.Stop != nil && *job.Stop) {
		for _, g := range job.TaskGroups {
			g.Count = ptr(0)
		}
		if _, _, err := n.Jobs().Register(job, w.WithContext(ctx)); err != nil {
			return fmt.Errorf("scaling job %s to zero: %w", jobID, err)
		}
	}
	if _, _, err := n.Jobs().Deregister(jobID, false, w.WithContext(ctx)); err != nil && !isNotFound(err) {
		return fmt.Errorf("stopping job %s: %w", jobID, err)
	}
	allocs, _, err := n.Jobs().Allocations(jobID, true, q.WithContext(ctx))
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("listing allocations of job %s: %w", jobID, err)
	}
	var ids []string
	for _, a := range allocs {
		if !terminal(a.ClientStatus) {
			ids = append(ids, a.ID)
		}
	}
	if err := waitAllocsStopped(ctx, n, ids, q); err != nil {
		return fmt.Errorf("stopping job %s: %w", jobID, err)
	}
	if _, _, err := n.Jobs().Deregister(jobID, true, w.WithContext(ctx)); err != nil && !isNotFound(err) {
		return fmt.Errorf("purging job %s: %w", jobID, err)
	}
	return nil
}

// jobInfo reads a job; nil (and no error) when it is gone or stopped.
func jobInfo(ctx context.Context, n *nomadapi.Client, jobID, region, namespace string) (*nomadapi.Job, error) {
	q := &nomadapi.QueryOptions{Region: region, Namespace: namespace}
	job, _, err := n.Jobs().Info(jobID, q.WithContext(ctx))
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading job %s in region %q: %w", jobID, region, err)
	}
	if (job.Stop != nil && *job.Stop) || (job.Status != nil && *job.Status == "dead") {
		return nil, nil
	}
	return job, nil
}

// resolveRegion is the region to use: the resource's, else the provider's,
// else the agent's own.
func resolveRegion(ctx context.Context, c *Clients, region string) (string, error) {
	if region != "" {
		return region, nil
	}
	if c.Region != "" {
		return c.Region, nil
	}
	_ = ctx // Agent().Region takes no options.
	r, err := c.Nomad.Agent().Region()
	if err != nil {
		return "", fmt.Errorf("asking the Nomad agent for its region: %w", err)
	}
	return r, nil
}

// waitNoInstances waits until Consul lists no oasis-engine instance of the
// model (Nomad deregisters them as the tasks stop).
func waitNoInstances(ctx context.Context, c *consulapi.Client, name string) error {
	for {
		n, err := modelInstances(ctx, c, name, false)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for model %s's %s instances to leave Consul (%d left): %w", name, engineService, n, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
}
