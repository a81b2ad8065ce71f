package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
)

// failThreshold consecutive failed polls make "health failing".
const failThreshold = 3

// healthTiming holds the health checker's periods; tests shorten them.
type healthTiming struct {
	// probe bounds one health request.
	probe time.Duration
	// steady is the poll period once the engine is ready.
	steady time.Duration
	// remote is the openai_compat endpoint poll period.
	remote time.Duration
	// recoveredEvent bounds the wait for the restarted client to wait on the recovered task
	// (the sign it routes the task's events) before the reattach event goes out anyway.
	recoveredEvent time.Duration
}

var defaultHealthTiming = healthTiming{
	probe:          2 * time.Second,
	steady:         5 * time.Second,
	remote:         10 * time.Second,
	recoveredEvent: time.Minute,
}

// startupInterval polls fast at first so readiness is seen within tens of
// milliseconds (the ≤200 ms driver-overhead budget), then backs off for
// engines that load large models for minutes.
func startupInterval(elapsed time.Duration) time.Duration {
	switch {
	case elapsed < 2*time.Second:
		return 5 * time.Millisecond // a refused connect costs microseconds
	case elapsed < 5*time.Second:
		return 20 * time.Millisecond
	case elapsed < time.Minute:
		return 250 * time.Millisecond
	default:
		return time.Second
	}
}

// probe GETs url; ok when the status satisfies accept.
func probe(ctx context.Context, client *http.Client, url string, accept func(int) bool) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if !accept(resp.StatusCode) {
		return false, "HTTP " + strconv.Itoa(resp.StatusCode)
	}
	return true, ""
}

func is200(code int) bool { return code == http.StatusOK }

// reachable accepts any answer below 500: without the API key a remote
// OpenAI API answers 401, which still proves it is up.
func reachable(code int) bool { return code < http.StatusInternalServerError }

func (d *Driver) newHealthClient() *http.Client {
	return &http.Client{Timeout: d.timing.probe, Transport: &http.Transport{DisableKeepAlives: true}}
}

// newNamespaceHealthClient dials from inside the network namespace at path:
// an engine in bridge mode may listen on loopback there (only its sidecar
// reaches it), and the host's view of the mapped port depends on NAT rules
// the driver does not own.
func (d *Driver) newNamespaceHealthClient(path string) *http.Client {
	dialer := &net.Dialer{}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		netns, err := ns.GetNS(path)
		if err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", path, err)
		}
		defer netns.Close()
		var conn net.Conn
		// The socket belongs to the namespace it was created in; once
		// connected it can be used from any thread.
		err = netns.Do(func(ns.NetNS) error {
			var derr error
			conn, derr = dialer.DialContext(ctx, network, addr)
			return derr
		})
		return conn, err
	}
	return &http.Client{Timeout: d.timing.probe, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
}

// watchHealth reports readiness and health of a process task until it ends.
func (d *Driver) watchHealth(h *taskHandle, recovered bool) {
	client := d.newHealthClient()
	if h.state.HealthNetNS != "" {
		client = d.newNamespaceHealthClient(h.state.HealthNetNS)
	}
	url := h.state.HealthURL
	if !recovered {
		start := h.state.StartedAt
		deadline := start.Add(h.state.HealthTimeout)
		warned := false
		for {
			ok, detail := probe(h.ctx, client, url, is200)
			if ok {
				now := time.Now()
				after := now.Sub(h.called)
				h.mu.Lock()
				h.health, h.readyAfter = "ready", after
				h.mu.Unlock()
				// ready_after_ms counts from StartTask; launched_ms from
				// the engine's exec (what the engine itself spent).
				d.emit(h.taskConfig, fmt.Sprintf("Engine ready after %.1f s", after.Seconds()), map[string]string{
					"ready_after_ms": strconv.FormatFloat(float64(after.Microseconds())/1e3, 'f', 1, 64),
					"launched_ms":    strconv.FormatFloat(float64(now.Sub(start).Microseconds())/1e3, 'f', 1, 64),
				})
				break
			}
			if !warned && time.Now().After(deadline) {
				warned = true
				h.setHealth("failing")
				d.emit(h.taskConfig, fmt.Sprintf("Health failing: %s not ready after %s (%s)", url, h.state.HealthTimeout, detail), nil)
			}
			if ctxsleep.Sleep(h.ctx, startupInterval(time.Since(start))) != nil {
				return
			}
		}
	}
	if recovered {
		// The client drops the events of an allocation it has not finished restoring (it
		// finds a task's event handler among the allocations it holds), and it restores
		// every allocation before it runs any; each task runner it runs then waits on its
		// task (WaitTask). So that call is when the reattachment (with the engine's health)
		// can be reported without being lost. TaskStats is no such sign: the client asks
		// for stats only when the agent publishes allocation metrics, off by default.
		select {
		case <-h.attached:
		case <-time.After(d.timing.recoveredEvent):
		case <-h.ctx.Done():
			return
		}
		health := "engine healthy"
		if ok, detail := probe(h.ctx, client, url, is200); ok {
			h.setHealth("ready")
		} else {
			health = "engine not answering its health check (" + detail + ")"
		}
		d.emit(h.taskConfig, fmt.Sprintf("Reattached to engine (pid %d) after a client restart; %s", h.state.Pid, health), nil)
	}
	d.watchSteady(h, client, url, is200, h.logger)
}

// watchSteady polls a ready task and reports transitions to failing and back.
// It returns when the task's context ends.
func (d *Driver) watchSteady(h *taskHandle, client *http.Client, url string, accept func(int) bool, logger hclog.Logger) {
	fails := 0
	for ctxsleep.Sleep(h.ctx, d.timing.steady) == nil {
		ok, detail := probe(h.ctx, client, url, accept)
		if h.ctx.Err() != nil {
			return
		}
		if ok {
			if fails >= failThreshold {
				d.emit(h.taskConfig, "Engine healthy again", nil)
			}
			fails = 0
			h.setHealth("ready")
			continue
		}
		fails++
		logger.Debug("health check failed", "url", url, "detail", detail, "consecutive", fails)
		if fails == failThreshold {
			h.setHealth("failing")
			d.emit(h.taskConfig, fmt.Sprintf("Health failing: %s (%s, %d checks in a row)", url, detail, fails), nil)
		}
	}
}

// startRemote "starts" an openai_compat task: it checks the endpoint once
// and then watches it; nothing runs locally.
func (d *Driver) startRemote(cfg *drivers.TaskConfig, handle *drivers.TaskHandle, st TaskState, logger hclog.Logger) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Second)
	ok, detail := probe(ctx, d.newHealthClient(), st.HealthURL, reachable)
	cancel()
	if !ok {
		return nil, nil, structs.NewRecoverableError(
			fmt.Errorf("endpoint: openai_compat endpoint unreachable (GET %s: %s)", st.HealthURL, detail), true)
	}
	st.StartedAt = start
	if err := handle.SetDriverState(&st); err != nil {
		return nil, nil, fmt.Errorf("storing driver state: %w", err)
	}
	h := newHandle(logger, st)
	h.health, h.readyAfter = "ready", time.Since(start)
	d.tasks.Set(cfg.ID, h)
	d.emit(cfg, fmt.Sprintf("Remote endpoint %s ready after %.1f s", st.HealthURL, h.readyAfter.Seconds()), nil)
	go d.watchRemote(h)
	return handle, nil, nil
}

// watchRemote keeps an openai_compat task running while its endpoint
// answers; failThreshold failures in a row end the task with exit code 1.
func (d *Driver) watchRemote(h *taskHandle) {
	defer close(h.doneCh)
	client := d.newHealthClient()
	fails := 0
	for ctxsleep.Sleep(h.ctx, d.timing.remote) == nil {
		ok, detail := probe(h.ctx, client, h.state.HealthURL, reachable)
		if h.ctx.Err() != nil {
			break
		}
		if ok {
			fails = 0
			h.setHealth("ready")
			continue
		}
		fails++
		if fails == failThreshold {
			h.setHealth("failing")
			msg := fmt.Sprintf("Health failing: remote endpoint %s (%s, %d checks in a row); stopping the task", h.state.HealthURL, detail, fails)
			d.emit(h.taskConfig, msg, nil)
			h.exited(&drivers.ExitResult{ExitCode: 1, Err: errors.New(msg)}, time.Now())
			h.cancel()
			return
		}
	}
	h.exited(&drivers.ExitResult{}, time.Now())
}
