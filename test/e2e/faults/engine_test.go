package faults

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

const (
	// loadClients keep several requests in flight on each of three engines.
	loadClients = 12
	// steadyFor is how long the load runs before a fault and after recovery.
	steadyFor = 5 * time.Second
	// requestDeadline is every request's X-Oasis-Deadline-Ms: far above any
	// request's time, so that the policy's timeouts, not the deadline, end a
	// request to a broken engine.
	requestDeadline = 30 * time.Second
)

// faultRun is a steady load through the router over three engines of one
// model, one of which (the victim) the test breaks.
type faultRun struct {
	t       *testing.T
	model   string
	engines []*engine
	victim  *engine
	r       *routerProc
	load    *load
	watch   *poolWatch
	// inFlight is the router's in-flight request count on the victim just
	// before the fault: the most requests the fault can reach.
	inFlight int
	// retries is the router's retry count just before the fault.
	retries float64
}

func startFaultRun(t *testing.T, model, policy string) *faultRun {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := &faultRun{t: t, model: model}
	f.engines = startEngines(t, ctx, model, 3)
	f.victim = f.engines[0]
	f.r = startRouter(t, model, policy, len(f.engines))
	f.load = startLoad(t, loadConfig{url: f.r.url, model: model, clients: loadClients, deadline: requestDeadline})
	time.Sleep(steadyFor)
	return f
}

// strike samples the router's in-flight requests on the victim and at once
// sends the victim's process sig; it returns when it did.
func (f *faultRun) strike(sig syscall.Signal) time.Time {
	f.watch = watchPool(f.t, f.r, f.model)
	m := f.r.mustMetrics(f.t)
	f.inFlight = int(m.sum("oasis_router_worker_in_flight", f.victim.allocID))
	f.retries = m.sum("oasis_router_retries_total", "model="+f.model)
	at := time.Now()
	must.NoError(f.t, syscall.Kill(f.victim.pid, sig))
	return at
}

// victimService is the victim's Consul service id in a sample ("" when
// Consul does not list it).
func (f *faultRun) victimService(s poolSample) string {
	for _, id := range s.consul.registered {
		if strings.Contains(id, f.victim.allocID) {
			return id
		}
	}
	return ""
}

// settle waits until recovered, then scrapes the router twice, steadyFor
// apart, while the load goes on, and stops the load.
func (f *faultRun) settle(recovered time.Time) (m1, m2 metricSet, rs []result) {
	time.Sleep(time.Until(recovered))
	m1 = f.r.mustMetrics(f.t)
	time.Sleep(steadyFor)
	m2 = f.r.mustMetrics(f.t)
	return m1, m2, f.load.Stop()
}

// assertVictimIdle checks that the router sent the victim nothing between
// two scrapes: no request in flight, none ended there, none retried away.
func (f *faultRun) assertVictimIdle(m1, m2 metricSet) {
	t, id := f.t, f.victim.allocID
	must.Zero(t, m1.sum("oasis_router_worker_in_flight", id), must.Sprint("requests in flight on the victim after recovery"))
	must.Zero(t, m2.sum("oasis_router_worker_in_flight", id), must.Sprint("requests in flight on the victim at the end"))
	must.Eq(t, m1.sum("oasis_router_requests_total", id), m2.sum("oasis_router_requests_total", id),
		must.Sprint("requests ended on the victim after recovery"))
	must.Eq(t, m1.sum("oasis_router_retries_total", "model="+f.model), m2.sum("oasis_router_retries_total", "model="+f.model),
		must.Sprint("requests retried after recovery"))
}

// assertPhases reports the load's phases around the fault and checks them:
// no request lost in any; every request before the fault and after recovery
// ok; the fault reached requests in flight on the victim.
func (f *faultRun) assertPhases(rs []result, fault, recovered time.Time) (before, during, after tally) {
	t := f.t
	before, during, after = report(t, rs, fault, recovered)
	must.Zero(t, before.lost+during.lost+after.lost, must.Sprint("requests lost"))
	must.EqOp(t, before.total, before.ok)
	must.EqOp(t, after.total, after.ok)
	must.Positive(t, after.total)
	must.Positive(t, f.inFlight, must.Sprint("the fault must reach requests in flight"))
	return before, during, after
}

// assertMigrated checks that no request failed, not even cleanly: every
// stream the fault broke after its first token was continued on another
// engine (the router's in-flight migration), every other request retried;
// and that every stream in flight between fault and recovery is token for
// token the uninterrupted answer: its request replayed now, with the same
// seed, on the engines left. It returns the migrations counted by reason.
func (f *faultRun) assertMigrated(rs []result, m metricSet, fault, recovered time.Time, reason string) float64 {
	t := f.t
	for _, r := range rs {
		must.EqOp(t, outcomeOK, r.outcome, must.Sprint(r))
	}
	_, during, _ := phases(rs, fault, recovered)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		compared int
	)
	sem := make(chan struct{}, loadClients)
	for _, r := range during {
		if !r.stream {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			again := f.load.replay(r)
			mu.Lock()
			defer mu.Unlock()
			compared++
			if again.outcome != outcomeOK || again.text != r.text {
				t.Errorf("a stream differs from its uninterrupted answer:\n  got  %q\n  want %q (%s)", r.text, again.text, again)
			}
		}()
	}
	wg.Wait()
	must.Positive(t, compared)
	failed := m.sum("oasis_router_migrations_failed_total", "model="+f.model)
	must.Zero(t, failed, must.Sprint("streams the router could not continue"))
	must.Zero(t, m.sum("oasis_router_stream_errors_total", "model="+f.model), must.Sprint("streams ended with an error event"))
	n := m.sum("oasis_router_migrations_total", "model="+f.model, "reason="+reason)
	t.Logf("%d streams in flight during the fault compared token for token with their uninterrupted answer; %.0f migrated (%s), %.0f tokens resent",
		compared, n, reason, m.sum("oasis_router_migration_resent_tokens_total", "model="+f.model))
	return n
}

// TestEngineKilledUnderLoad SIGKILLs one of three engines while the router
// serves a steady load of streamed and whole chat requests: a crashed
// engine. Nomad sees the task die and deregisters its service.
//
// Lost: nothing. Streams that engine had already begun sending go on on
// another engine (in-flight migration); requests that had not got their
// first byte are retried. Asserted: every request ends ok (0 clean errors,
// 0 SSE error events); every stream in flight during the fault equals its
// uninterrupted answer token for token (same seed, replayed); the kill
// reached requests (migrated or retried); once the router has dropped the
// engine (1 s margin), it sends it nothing and retries nothing.
func TestEngineKilledUnderLoad(t *testing.T) {
	f := startFaultRun(t, "kill-llama", `{"policy":"round_robin"}`)
	killed := f.strike(syscall.SIGKILL)
	left := f.watch.waitUntil(t, "the killed engine leaving Consul's passing instances", 30*time.Second,
		func(s poolSample) bool { return !s.passes(f.victim.allocID) })
	leftConsul, how := left.at, "deregistered"
	if out, ok := left.consul.failing[f.victimService(left)]; ok {
		how = "critical (" + out + ")"
	}
	dropped := f.watch.waitUntil(t, "the router dropping the killed engine", 30*time.Second,
		func(s poolSample) bool { return s.routed == len(f.engines)-1 }).at
	// A request picked just before the drop fails over at once (the port is
	// closed); the margin covers a loaded machine's scheduling.
	recovered := dropped.Add(time.Second)
	m1, m2, rs := f.settle(recovered)

	retried := m2.sum("oasis_router_retries_total", "model="+f.model) - f.retries
	t.Logf("SIGKILL of %s (pid %d) with %d requests in flight on it: %s in Consul after %s, out of the router after %s; %.0f requests retried on another engine",
		f.victim.job, f.victim.pid, f.inFlight, how, leftConsul.Sub(killed).Round(time.Millisecond),
		dropped.Sub(killed).Round(time.Millisecond), retried)
	f.assertPhases(rs, killed, recovered)
	migrated := f.assertMigrated(rs, m2, killed, recovered, "engine_failed")
	// The requests in flight on the engine were migrated or retried: the
	// kill reached at least one.
	must.Positive(t, migrated+retried)
	f.assertVictimIdle(m1, m2)
}

// TestEngineStoppedUnderLoad SIGSTOPs one of three engines (SIGCONT when the
// test ends) while the router serves a steady load: a hung engine, whose
// port still accepts connections. Nothing tells Nomad; Consul's 1 s HTTP
// check turns critical and the router drops the engine. The policy's
// timeouts are short: response_header 3s, stream_idle 2s, first_token_hold 1s.
//
// Lost: nothing. Streams already sent to their client (head or token) from
// that engine go on on another engine after stream_idle (in-flight
// migration). Asserted: every request ends ok (0 clean errors, 0 SSE error
// events), every stream in flight during the stop equals its uninterrupted
// answer token for token, at least one was migrated (stream_idle); no
// request is slower than
// response_header + stream_idle + twice the slowest request before the stop
// (the wait on the silent engine plus a retry elsewhere), nor than its
// deadline; once the router has dropped the engine and its last requests
// have timed out, it sends it nothing.
func TestEngineStoppedUnderLoad(t *testing.T) {
	const header, idle = 3 * time.Second, 2 * time.Second
	f := startFaultRun(t, "stop-llama",
		`{"policy":"round_robin","timeouts":{"response_header":"3s","stream_idle":"2s","first_token_hold":"1s"}}`)
	// Registered after the jobs' cleanups, so it runs before them: a stopped
	// process cannot be stopped gracefully.
	t.Cleanup(func() { _ = syscall.Kill(f.victim.pid, syscall.SIGCONT) })
	stopped := f.strike(syscall.SIGSTOP)
	failed := f.watch.waitUntil(t, "Consul's check of the stopped engine failing", 30*time.Second,
		func(s poolSample) bool { return !s.passes(f.victim.allocID) })
	critical := failed.at
	dropped := f.watch.waitUntil(t, "the router dropping the stopped engine", 30*time.Second,
		func(s poolSample) bool { return s.routed == len(f.engines)-1 }).at
	// Requests sent to the engine before the drop wait out response_header,
	// then go elsewhere.
	recovered := dropped.Add(header + time.Second)
	m1, m2, rs := f.settle(recovered)

	retried := m2.sum("oasis_router_retries_total", "model="+f.model) - f.retries
	t.Logf("SIGSTOP of %s (pid %d) with %d requests in flight on it: critical in Consul after %s (%s), out of the router after %s; %.0f requests retried on another engine",
		f.victim.job, f.victim.pid, f.inFlight, critical.Sub(stopped).Round(time.Millisecond), failed.consul.failing[f.victimService(failed)],
		dropped.Sub(stopped).Round(time.Millisecond), retried)
	before, during, after := f.assertPhases(rs, stopped, recovered)
	migrated := f.assertMigrated(rs, m2, stopped, recovered, "stream_idle")
	must.Positive(t, migrated+retried)
	bound := header + idle + 2*before.maxLatency
	must.LessEq(t, bound, during.maxLatency, must.Sprint("a request took longer than the timeouts allow"))
	must.LessEq(t, requestDeadline, max(during.maxLatency, after.maxLatency))
	f.assertVictimIdle(m1, m2)
}
