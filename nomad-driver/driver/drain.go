package driver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// Graceful drain (issue #37): before StopTask signals an engine it waits for
// the requests already on it to finish. Nomad has deregistered the task's
// service by then (and waited the group's shutdown_delay), so no new requests
// arrive; the engine's own running and waiting counts, read from its
// /metrics, say when the last one is done. The wait is bounded by the stop
// timeout Nomad passes (the task's kill_timeout); an engine whose metrics
// cannot be read is signalled at once.

const (
	// drainPoll is the period between two reads of the engine's counts.
	drainPoll = 250 * time.Millisecond
	// drainMaxBody bounds one /metrics read; vLLM's page is tens of kB.
	drainMaxBody = 4 << 20
	// drainSettle is waited after the counts reach zero, when they were not
	// zero at first: an engine counts a request done when it generates the
	// last token, a moment before its HTTP layer has sent the final chunk
	// and [DONE].
	drainSettle = 500 * time.Millisecond
	// drainMinExitGrace is the least time the engine gets between the
	// signal and SIGKILL after a drain that used up the stop timeout.
	drainMinExitGrace = 5 * time.Second
)

// drainMetrics names the series whose sum is an engine's in-flight requests.
type drainMetrics struct {
	// prom are Prometheus text series names; json marks TRT-LLM's JSON
	// iteration stats instead.
	prom []string
	json bool
}

// drainMetricsFor returns the in-flight series of an engine; ok is false for
// engines with nothing to drain (openai_compat) or unknown ones.
func drainMetricsFor(engine string) (drainMetrics, bool) {
	switch engine {
	case config.EngineVLLM, config.EngineSim:
		return drainMetrics{prom: []string{"vllm:num_requests_running", "vllm:num_requests_waiting"}}, true
	case config.EngineSGLang:
		return drainMetrics{prom: []string{"sglang:num_running_reqs", "sglang:num_queue_reqs"}}, true
	case config.EngineLlamaCpp:
		return drainMetrics{prom: []string{"llamacpp:requests_processing", "llamacpp:requests_deferred"}}, true
	case config.EngineTRTLLM:
		// trtllm-serve's /metrics is a JSON array of iteration stats.
		return drainMetrics{json: true}, true
	}
	return drainMetrics{}, false
}

// ErrNoDrainMetrics is returned when the engine's metrics carry none of the
// in-flight series.
var ErrNoDrainMetrics = errors.New("no in-flight request metrics")

// MetricsStatusError is a /metrics answer other than 200.
type MetricsStatusError struct {
	URL    string
	Status int
}

func (e *MetricsStatusError) Error() string {
	return fmt.Sprintf("GET %s: status %d", e.URL, e.Status)
}

// inFlight reads the engine's in-flight request count once.
func inFlight(ctx context.Context, client *http.Client, url string, m drainMetrics) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("reading in-flight requests: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("reading in-flight requests: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, &MetricsStatusError{URL: url, Status: resp.StatusCode}
	}
	body := io.LimitReader(resp.Body, drainMaxBody)
	if m.json {
		return parseTRTLLMInFlight(body)
	}
	return parsePromSum(body, m.prom)
}

// parsePromSum sums every sample of the named series in Prometheus text
// format (vLLM labels its gauges per model); ErrNoDrainMetrics when none
// appears.
func parsePromSum(r io.Reader, names []string) (int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	sum, seen := 0.0, false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := splitSample(line)
		if !contains(names, name) {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || v < 0 {
			continue
		}
		sum += v
		seen = true
	}
	if err := sc.Err(); err != nil && !seen {
		return 0, fmt.Errorf("parsing metrics: %w", err)
	}
	if !seen {
		return 0, ErrNoDrainMetrics
	}
	return int(sum + 0.5), nil
}

// splitSample splits a sample line into its metric name and what follows
// the label set.
func splitSample(line string) (name, rest string) {
	i := strings.IndexAny(line, "{ \t")
	if i < 0 {
		return line, ""
	}
	name = line[:i]
	if line[i] != '{' {
		return name, line[i:]
	}
	// Skip the label set; values are quoted and may hold '}' or escapes.
	inQuote := false
	for j := i + 1; j < len(line); j++ {
		switch c := line[j]; {
		case inQuote && c == '\\':
			j++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return name, line[j+1:]
		}
	}
	return name, ""
}

func contains(names []string, s string) bool {
	for _, n := range names {
		if n == s {
			return true
		}
	}
	return false
}

// parseTRTLLMInFlight reads the newest entry of trtllm-serve's iteration
// stats: active plus queued requests.
func parseTRTLLMInFlight(r io.Reader) (int, error) {
	var stats []struct {
		Active *int `json:"numActiveRequests"`
		Queued *int `json:"numQueuedRequests"`
	}
	if err := json.NewDecoder(r).Decode(&stats); err != nil {
		return 0, fmt.Errorf("parsing trtllm iteration stats: %w", err)
	}
	if len(stats) == 0 {
		// No iteration since the last read: nothing is scheduled.
		return 0, nil
	}
	last := stats[len(stats)-1]
	if last.Active == nil {
		return 0, ErrNoDrainMetrics
	}
	n := *last.Active
	if last.Queued != nil {
		n += *last.Queued
	}
	return n, nil
}

// drainResult says how a drain ended.
type drainResult struct {
	// Drained is true when the counts reached zero.
	Drained bool
	// Left is the last in-flight count read (at the bound, or before an
	// unreadable read).
	Left int
	// Err is why the metrics could not be read; the drain then ended at once.
	Err error
}

// drainWait polls the engine's in-flight count until it is zero (then waits
// settle more, unless it was zero at once), ctx ends (the bound), or a read
// fails. onDraining is called once, with the first non-zero count.
func drainWait(ctx context.Context, client *http.Client, url string, m drainMetrics, poll, settle time.Duration, onDraining func(n int)) drainResult {
	announced := false
	last := 0
	for {
		n, err := inFlight(ctx, client, url, m)
		switch {
		case err != nil && ctx.Err() != nil:
			return drainResult{Left: last}
		case err != nil:
			return drainResult{Left: last, Err: err}
		case n == 0 && announced:
			t := time.NewTimer(settle)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			return drainResult{Drained: true}
		case n == 0:
			return drainResult{Drained: true}
		}
		last = n
		if !announced {
			announced = true
			onDraining(n)
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return drainResult{Left: last}
		case <-t.C:
		}
	}
}

// metricsURL is the engine's /metrics next to its health endpoint.
func metricsURL(healthURL string) string {
	return strings.TrimSuffix(healthURL, "/health") + "/metrics"
}

// drain waits, within timeout, for the requests on h's engine to finish, and
// returns the time the engine should get between the signal and SIGKILL:
// what is left of timeout, at least drainMinExitGrace (or timeout if less).
func (d *Driver) drain(h *taskHandle, timeout time.Duration) time.Duration {
	m, ok := drainMetricsFor(h.state.Engine)
	if !ok || h.state.Remote || h.state.HealthURL == "" || timeout <= 0 {
		return timeout
	}
	client := d.newHealthClient()
	if h.state.HealthNetNS != "" {
		client = d.newNamespaceHealthClient(h.state.HealthNetNS)
	}
	client.Timeout = d.timing.probe
	start := time.Now()
	ctx, cancel := context.WithTimeout(h.ctx, timeout)
	defer cancel()
	draining := false
	res := drainWait(ctx, client, metricsURL(h.state.HealthURL), m, drainPoll, drainSettle, func(n int) {
		draining = true
		d.emit(h.taskConfig, fmt.Sprintf("Draining: %d requests in flight", n), nil)
	})
	took := time.Since(start)
	switch {
	case res.Err != nil:
		h.logger.Info("engine metrics unreadable; stopping without drain", "error", res.Err)
	case h.ctx.Err() != nil:
		// The engine exited during the drain; there is nothing left to wait for.
	case res.Drained && draining:
		d.emit(h.taskConfig, fmt.Sprintf("Drained in %.1f s", took.Seconds()), nil)
	case !res.Drained:
		d.emit(h.taskConfig, fmt.Sprintf("Drain timeout: %d requests still in flight after %s", res.Left, timeout), nil)
	}
	left := timeout - took
	if floor := min(timeout, drainMinExitGrace); left < floor {
		left = floor
	}
	return left
}
