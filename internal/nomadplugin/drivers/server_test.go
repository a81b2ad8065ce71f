package drivers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	plugin "github.com/hashicorp/go-plugin"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
	driverspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// fakeDriver records what the client sent and answers from its fields.
type fakeDriver struct {
	events *Eventer

	mu        sync.Mutex
	started   *TaskConfig
	recovered *TaskHandle
	stopped   []any
	exit      chan *ExitResult
	startErr  error
}

var errBoom = errors.New("engine binary missing")

func (f *fakeDriver) PluginInfo() (*base.PluginInfoResponse, error) {
	return &base.PluginInfoResponse{Type: base.PluginTypeDriver, PluginApiVersions: []string{ApiVersion010}, PluginVersion: "0.1.0", Name: "fake"}, nil
}
func (f *fakeDriver) ConfigSchema() (*hclspec.Spec, error) { return hclspec.NewObject(nil), nil }
func (f *fakeDriver) SetConfig(*base.Config) error         { return nil }
func (f *fakeDriver) TaskConfigSchema() (*hclspec.Spec, error) {
	return hclspec.NewObject(map[string]*hclspec.Spec{"engine": hclspec.NewAttr("engine", "string", true)}), nil
}
func (f *fakeDriver) Capabilities() (*Capabilities, error) {
	return &Capabilities{SendSignals: true, Exec: true, FSIsolation: FSIsolationNone, NetIsolationModes: []NetIsolationMode{NetIsolationModeHost}}, nil
}
func (f *fakeDriver) Fingerprint(ctx context.Context) (<-chan *Fingerprint, error) {
	ch := make(chan *Fingerprint, 1)
	ch <- &Fingerprint{Health: HealthStateHealthy, HealthDescription: "ok"}
	return ch, nil
}
func (f *fakeDriver) RecoverTask(h *TaskHandle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recovered = h
	return nil
}
func (f *fakeDriver) StartTask(cfg *TaskConfig) (*TaskHandle, *DriverNetwork, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.startErr != nil {
		return nil, nil, f.startErr
	}
	f.started = cfg
	h := NewTaskHandle(2)
	h.Config, h.State = cfg, TaskStateRunning
	if err := h.SetDriverState(map[string]any{"pid": 42}); err != nil {
		return nil, nil, err
	}
	_ = f.events.EmitEvent(&TaskEvent{TaskID: cfg.ID, AllocID: cfg.AllocID, TaskName: cfg.Name, Timestamp: t0, Message: "Starting"})
	return h, nil, nil
}
func (f *fakeDriver) WaitTask(ctx context.Context, id string) (<-chan *ExitResult, error) {
	if id != "t1" {
		return nil, ErrTaskNotFound
	}
	return f.exit, nil
}
func (f *fakeDriver) StopTask(id string, timeout time.Duration, signal string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = []any{id, timeout, signal}
	f.exit <- &ExitResult{ExitCode: 0, Signal: 15}
	return nil
}
func (f *fakeDriver) DestroyTask(id string, force bool) error { return nil }
func (f *fakeDriver) InspectTask(id string) (*TaskStatus, error) {
	if id != "t1" {
		return nil, ErrTaskNotFound
	}
	return &TaskStatus{ID: id, Name: "engine", State: TaskStateRunning, StartedAt: t0, DriverAttributes: map[string]string{"health": "ready"}}, nil
}
func (f *fakeDriver) TaskStats(ctx context.Context, id string, interval time.Duration) (<-chan *TaskResourceUsage, error) {
	ch := make(chan *TaskResourceUsage)
	go func() {
		defer close(ch)
		for i := range 3 {
			u := &TaskResourceUsage{Timestamp: t0.Add(time.Duration(i) * interval).UnixNano(),
				ResourceUsage: &ResourceUsage{MemoryStats: &MemoryStats{RSS: uint64(i + 1), Measured: []string{"RSS"}}, CpuStats: &CpuStats{}}}
			select {
			case ch <- u:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}
func (f *fakeDriver) TaskEvents(ctx context.Context) (<-chan *TaskEvent, error) {
	return f.events.TaskEvents(ctx)
}
func (f *fakeDriver) SignalTask(id, sig string) error { return nil }
func (f *fakeDriver) ExecTask(id string, cmd []string, timeout time.Duration) (*ExecTaskResult, error) {
	return &ExecTaskResult{Stdout: []byte(strings.Join(cmd, " ")), ExitResult: &ExitResult{ExitCode: 7}}, nil
}

// ExecTaskStreaming echoes stdin to stdout in upper case and exits 3.
func (f *fakeDriver) ExecTaskStreaming(ctx context.Context, id string, opts *ExecOptions) (*ExitResult, error) {
	in, err := io.ReadAll(opts.Stdin)
	if err != nil {
		return nil, err
	}
	if _, err := opts.Stdout.Write(bytes.ToUpper(in)); err != nil {
		return nil, err
	}
	if _, err := opts.Stderr.Write([]byte(strings.Join(opts.Command, " "))); err != nil {
		return nil, err
	}
	return &ExitResult{ExitCode: 3}, nil
}

func dispenseDriver(t *testing.T, impl DriverPlugin) DriverPlugin {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		base.PluginTypeBase:   &base.PluginBase{Impl: impl},
		base.PluginTypeDriver: &PluginDriver{Impl: impl},
	})
	// Closing the client alone ends the in-memory server's connection
	// (calling both races in go-plugin's test helper).
	t.Cleanup(func() { _ = client.Close() })
	_ = server
	raw, err := client.Dispense(base.PluginTypeDriver)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(DriverPlugin)
}

// TestGRPCRoundTrip drives a task's life through the wire protocol as a
// Nomad client does: events, start, inspect, stats, recover, stop, wait.
func TestGRPCRoundTrip(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	impl := &fakeDriver{events: NewEventer(ctx, nil), exit: make(chan *ExitResult, 1)}
	c := dispenseDriver(t, impl)

	info, err := c.PluginInfo()
	must(t, err)
	if info.Type != base.PluginTypeDriver || info.Name != "fake" {
		t.Fatalf("plugin info %+v", info)
	}
	events, err := c.TaskEvents(ctx)
	must(t, err)
	// The subscription is registered on the server once the stream is up;
	// emitting before that would reach no one.
	testutil.Eventually(t, 5*time.Second, "the events subscription", func() bool { impl.events.mu.Lock(); defer impl.events.mu.Unlock(); return len(impl.events.subs) == 1 })

	cfg := fullTaskConfig(t)
	cfg.ID = "t1"
	h, _, err := c.StartTask(cfg)
	must(t, err)
	var state map[string]int
	must(t, h.GetDriverState(&state))
	if h.Version != 2 || state["pid"] != 42 || h.Config.AllocDir != cfg.AllocDir {
		t.Fatalf("handle %+v state %v", h, state)
	}
	if got := impl.started; got.Resources.Ports[0].To != 8000 || got.NetworkIsolation.Path != "/var/run/netns/a1" || got.StdoutPath != cfg.StdoutPath {
		t.Fatalf("driver got %+v", got)
	}
	select {
	case ev := <-events:
		if ev.Message != "Starting" || ev.TaskID != "t1" || !ev.Timestamp.Equal(t0) {
			t.Fatalf("event %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no task event")
	}

	st, err := c.InspectTask("t1")
	must(t, err)
	if st.State != TaskStateRunning || st.DriverAttributes["health"] != "ready" || !st.StartedAt.Equal(t0) {
		t.Fatalf("status %+v", st)
	}
	if _, err := c.InspectTask("nope"); !errors.Is(err, ErrTaskNotFound) {
		t.Fatalf("inspect of an unknown task: %v, want ErrTaskNotFound", err)
	}

	stats, err := c.TaskStats(ctx, "t1", time.Second)
	must(t, err)
	var rss []uint64
	for u := range stats {
		rss = append(rss, u.ResourceUsage.MemoryStats.RSS)
	}
	if len(rss) != 3 || rss[2] != 3 {
		t.Fatalf("stats RSS %v, want [1 2 3]", rss)
	}

	must(t, c.RecoverTask(h))
	if impl.recovered == nil || !bytes.Equal(impl.recovered.DriverState, h.DriverState) || impl.recovered.Config.ID != "t1" {
		t.Fatalf("recovered %+v", impl.recovered)
	}

	wait, err := c.WaitTask(ctx, "t1")
	must(t, err)
	must(t, c.StopTask("t1", 3*time.Second, "SIGTERM"))
	if impl.stopped[1] != 3*time.Second || impl.stopped[2] != "SIGTERM" {
		t.Fatalf("stop got %v", impl.stopped)
	}
	select {
	case res := <-wait:
		if res.Signal != 15 || res.Err != nil {
			t.Fatalf("exit %+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitTask did not return")
	}

	res, err := c.ExecTask("t1", []string{"echo", "hi"}, time.Second)
	must(t, err)
	if string(res.Stdout) != "echo hi" || res.ExitResult.ExitCode != 7 {
		t.Fatalf("exec %+v", res)
	}
}

// TestGRPCExecStreaming: stdin, stdout, stderr and the exit code of a
// streaming exec cross the wire.
func TestGRPCExecStreaming(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dispenseDriver(t, &fakeDriver{events: NewEventer(ctx, nil)})
	var stdout, stderr bytes.Buffer
	res, err := c.(*Client).ExecTaskStreaming(ctx, "t1", &ExecOptions{
		Command: []string{"cat"}, Stdin: io.NopCloser(strings.NewReader("hello")),
		Stdout: nopWriteCloser{&stdout}, Stderr: nopWriteCloser{&stderr},
	})
	must(t, err)
	if res.ExitCode != 3 || stdout.String() != "HELLO" || stderr.String() != "cat" {
		t.Fatalf("exit %d stdout %q stderr %q", res.ExitCode, stdout.String(), stderr.String())
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// TestGRPCRecoverableErrors: a StartTask error reaches the client with its
// recoverability, as Nomad's client reads it from the status detail.
func TestGRPCRecoverableErrors(t *testing.T) {
	for _, c := range []struct {
		name        string
		err         error
		recoverable bool
	}{
		{"recoverable", structs.NewRecoverableError(errBoom, true), true},
		{"not recoverable", structs.NewRecoverableError(errBoom, false), false},
		{"plain", errBoom, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cl := dispenseDriver(t, &fakeDriver{events: NewEventer(ctx, nil), startErr: c.err})
			_, _, err := cl.StartTask(&TaskConfig{ID: "t1"})
			if err == nil || !strings.Contains(err.Error(), errBoom.Error()) {
				t.Fatalf("err = %v, want it to carry %q", err, errBoom)
			}
			if got := structs.IsRecoverable(err); got != c.recoverable {
				t.Fatalf("recoverable = %v, want %v", got, c.recoverable)
			}
			var re *structs.RecoverableError
			if errors.As(c.err, &re) && !errors.As(err, &re) {
				t.Fatalf("%T carries no RecoverableError", err)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// rawExecDriver serves streaming exec on the raw message stream: it
// answers the first stdin message in upper case and exits with its length.
type rawExecDriver struct{ *fakeDriver }

func (r rawExecDriver) ExecTaskStreamingRaw(ctx context.Context, id string, cmd []string, tty bool, s ExecTaskStream) error {
	msg, err := s.Recv()
	if err != nil {
		return err
	}
	data := msg.GetStdin().GetData()
	if err := s.Send(&ExecTaskStreamingResponseMsg{Stdout: &driverspb.ExecTaskStreamingIOOperation{Data: bytes.ToUpper(data)}}); err != nil {
		return err
	}
	return s.Send(&ExecTaskStreamingResponseMsg{Exited: true, Result: &driverspb.ExitResult{ExitCode: int32(len(data))}})
}

// TestGRPCExecStreamingRaw: a driver with the raw interface gets the
// stream itself.
func TestGRPCExecStreamingRaw(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := dispenseDriver(t, rawExecDriver{&fakeDriver{events: NewEventer(ctx, nil)}})
	var stdout bytes.Buffer
	res, err := c.(*Client).ExecTaskStreaming(ctx, "t1", &ExecOptions{
		Command: []string{"cat"}, Stdin: io.NopCloser(strings.NewReader("abc")), Stdout: nopWriteCloser{&stdout},
	})
	must(t, err)
	if res.ExitCode != 3 || stdout.String() != "ABC" {
		t.Fatalf("exit %d stdout %q", res.ExitCode, stdout.String())
	}
}
