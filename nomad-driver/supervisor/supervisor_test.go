//go:build linux

package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/testutil"
)

func TestWaitReportsExitCodeAndSignal(t *testing.T) {
	for _, tc := range []struct {
		name         string
		script       string
		code, signal int
	}{
		{"exit 0", "exit 0", 0, 0},
		{"exit 3", "exit 3", 3, 0},
		{"killed by SIGTERM", "kill -TERM $$", 128 + 15, 15},
		{"killed by SIGKILL", "kill -KILL $$", 128 + 9, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, _ := shell(t, tc.script)
			h := launch(t, testConfig(t), cmd)
			ps := wait(t, h)
			if ps.ExitCode != tc.code || ps.Signal != tc.signal || ps.Pid != h.Pid() {
				t.Fatalf("Wait = %+v, want exit code %d, signal %d, pid %d", ps, tc.code, tc.signal, h.Pid())
			}
			if ps.Time.IsZero() {
				t.Fatal("Wait: no exit time")
			}
			// The status is kept: a second Wait gets it again.
			if again := wait(t, h); *again != *ps {
				t.Fatalf("second Wait = %+v, want %+v", again, ps)
			}
		})
	}
}

// TestWaitAfterReattach simulates the driver restarting: the first Handle
// is Closed, a fresh one Reattaches from the State (after a msgpack round
// trip, as Nomad's task handle stores it) and Waits.
func TestWaitAfterReattach(t *testing.T) {
	for _, tc := range []struct {
		name string
		// exitBeforeReattach: the engine exits while nobody is attached.
		exitBeforeReattach bool
	}{
		{"engine exits after reattach", false},
		{"engine exited while nobody was attached", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cmd, dir := shell(t, `read x < "$DIR/gate"; exit 7`)
			release := gate(t, dir)
			h := launch(t, cfg, cmd)
			st := roundTrip(t, h.State())
			if err := h.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if !alive(st.SupervisorPid) || !alive(st.EnginePid) {
				t.Fatal("Close ended the supervisor or the engine")
			}
			if tc.exitBeforeReattach {
				release()
				testutil.Eventually(t, 20*time.Second, "the engine to exit", func() bool { return !alive(st.EnginePid) })
			}
			h2, err := Reattach(ctxT(t, 10*time.Second), cfg, st)
			if err != nil {
				t.Fatalf("Reattach: %v", err)
			}
			defer h2.Close()
			if !tc.exitBeforeReattach {
				release()
			}
			if ps := wait(t, h2); ps.ExitCode != 7 || ps.Signal != 0 {
				t.Fatalf("Wait after Reattach = %+v, want exit code 7", ps)
			}
		})
	}
}

// TestReattachAfterDriverExit: the process that launched the supervisor
// exits (the driver dies); the supervisor, re-parented, keeps the engine;
// a new client reattaches, gets the exit status and Kills it all.
func TestReattachAfterDriverExit(t *testing.T) {
	cfg := testConfig(t)
	cmd, dir := shell(t, `sleep 1000 & echo $! > "$DIR/child"; read x < "$DIR/gate"; exit 9`)
	release := gate(t, dir)
	req, err := json.Marshal(launchRequest{Config: Config{LogFile: cfg.LogFile, SocketDir: cfg.SocketDir}, Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	driver := exec.Command(os.Args[0])
	driver.Env = append(os.Environ(), launcherEnv+"="+string(req))
	out, err := driver.Output()
	if err != nil {
		t.Fatalf("stand-in driver: %v: %s", err, out)
	}
	var st State
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("stand-in driver's state %q: %v", out, err)
	}
	if p, err := readProc(st.SupervisorPid); err != nil || p.ppid == os.Getpid() || !alive(st.EnginePid) {
		t.Fatalf("after the driver exited: supervisor %+v (%v), engine alive %v", p, err, alive(st.EnginePid))
	}
	child := pidIn(t, filepath.Join(dir, "child"))
	h, err := Reattach(ctxT(t, 10*time.Second), cfg, st)
	if err != nil {
		t.Fatalf("Reattach: %v", err)
	}
	release()
	if ps := wait(t, h); ps.ExitCode != 9 {
		t.Fatalf("Wait = %+v, want exit code 9", ps)
	}
	if err := h.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	for what, pid := range map[string]int{"supervisor": st.SupervisorPid, "engine's child": child} {
		if alive(pid) {
			t.Errorf("%s (pid %d) outlived Kill", what, pid)
		}
	}
}

// roundTrip encodes a State as the driver stores it in Nomad's task handle
// (base.MsgPackEncode: msgpack, codec tags) and decodes it again.
func roundTrip(t *testing.T, st State) State {
	t.Helper()
	var buf []byte
	if err := base.MsgPackEncode(&buf, st); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := base.MsgPackDecode(buf, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["supervisor_pid"]; !ok {
		t.Fatalf("encoded state has no codec-tagged keys: %v", m)
	}
	var out State
	if err := base.MsgPackDecode(buf, &out); err != nil {
		t.Fatal(err)
	}
	if out != st {
		t.Fatalf("state round trip: %+v, want %+v", out, st)
	}
	return out
}

func TestShutdown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		signal string
		grace  time.Duration
		code   int
		sig    int
		// minElapsed: the engine must have had its grace period.
		minElapsed time.Duration
	}{
		{"SIGINT trapped: clean exit within grace",
			`trap 'exit 0' INT; sleep 1000 & echo $! > "$DIR/child"; echo ready; wait`, "", 30 * time.Second, 0, 0, 0},
		{"named signal trapped",
			`trap 'exit 3' TERM; sleep 1000 & echo $! > "$DIR/child"; echo ready; wait`, "SIGTERM", 30 * time.Second, 3, 0, 0},
		{"SIGINT ignored: group SIGKILLed after grace",
			`trap '' INT; sleep 1000 & echo $! > "$DIR/child"; echo ready; wait`, "SIGINT", 500 * time.Millisecond, 137, 9, 500 * time.Millisecond},
		{"no grace: SIGKILL at once",
			`trap '' INT; sleep 1000 & echo $! > "$DIR/child"; echo ready; wait`, "", 0, 137, 9, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, dir := shell(t, tc.script)
			h := launch(t, testConfig(t), cmd)
			waitFile(t, cmd.StdoutPath, "ready")
			child := pidIn(t, filepath.Join(dir, "child"))
			start := time.Now()
			if err := h.Shutdown(ctxT(t, 60*time.Second), tc.signal, tc.grace); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			elapsed := time.Since(start)
			ps := wait(t, h)
			if ps.ExitCode != tc.code || ps.Signal != tc.sig {
				t.Fatalf("Wait = %+v, want exit code %d signal %d", ps, tc.code, tc.sig)
			}
			if elapsed < tc.minElapsed {
				t.Fatalf("Shutdown returned after %s, before the grace period %s", elapsed, tc.minElapsed)
			}
			if alive(child) {
				t.Fatalf("the engine's child %d (same process group) outlived Shutdown", child)
			}
		})
	}
}

func TestShutdownUnknownSignal(t *testing.T) {
	cmd, _ := shell(t, "exec sleep 1000")
	h := launch(t, testConfig(t), cmd)
	err := h.Shutdown(ctxT(t, 10*time.Second), "SIGNOPE", time.Second)
	if !errors.Is(err, ErrUnknownSignal) || !strings.Contains(err.Error(), "SIGNOPE") {
		t.Fatalf("Shutdown(SIGNOPE) = %v, want ErrUnknownSignal naming it", err)
	}
	if !alive(h.Pid()) {
		t.Fatal("a refused Shutdown stopped the engine")
	}
}

func TestSignal(t *testing.T) {
	cmd, _ := shell(t, `trap 'echo got USR1; exit 4' USR1; echo ready; while :; do sleep 0.05; done`)
	h := launch(t, testConfig(t), cmd)
	waitFile(t, cmd.StdoutPath, "ready")
	if err := h.Signal(syscall.SIGUSR1); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if ps := wait(t, h); ps.ExitCode != 4 {
		t.Fatalf("Wait = %+v, want exit code 4 from the USR1 trap", ps)
	}
	waitFile(t, cmd.StdoutPath, "got USR1")
	if err := h.Signal(syscall.SIGUSR1); !errors.Is(err, ErrEngineExited) {
		t.Fatalf("Signal after exit = %v, want ErrEngineExited", err)
	}
}

func TestStats(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		busy   bool
	}{
		{"idle tree", `sleep 1000 & sleep 1000 & wait`, false},
		{"busy loop", `i=0; while :; do i=$((i+1)); done`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, _ := shell(t, tc.script)
			h := launch(t, testConfig(t), cmd)
			ctx := ctxT(t, 60*time.Second)
			ch, err := h.Stats(ctx, 50*time.Millisecond)
			if err != nil {
				t.Fatalf("Stats: %v", err)
			}
			for u := range ch {
				if u.RSS == 0 || u.Timestamp.IsZero() {
					t.Fatalf("usage %+v: no RSS or timestamp", u)
				}
				if got := strings.Join(u.MemoryMeasured(), ","); got != "RSS,Swap" {
					t.Fatalf("MemoryMeasured = %s", got)
				}
				if !tc.busy || u.Percent > 0 {
					if tc.busy && (u.UserMode <= 0 || u.TotalTicks < 0) {
						t.Fatalf("busy usage %+v: no user-mode CPU", u)
					}
					return
				}
			}
			t.Fatal("stats channel closed before a sample showed the engine's use")
		})
	}
}

func TestStatsChannelClosesWithContext(t *testing.T) {
	cmd, _ := shell(t, "exec sleep 1000")
	h := launch(t, testConfig(t), cmd)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := h.Stats(ctx, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	cancel()
	for range ch {
	}
}

func TestExec(t *testing.T) {
	cmd, dir := shell(t, "exec sleep 1000")
	h := launch(t, testConfig(t), cmd)
	for _, tc := range []struct {
		name string
		argv []string
		code int
		want []string
	}{
		{"env, dir and both streams", []string{"sh", "-c", "echo $FOO; pwd; echo oops >&2; exit 5"}, 5, []string{"bar\n", dir + "\n", "oops\n"}},
		{"found in the task's PATH", []string{"env"}, 0, []string{"FOO=bar", "DIR=" + dir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code, err := h.Exec(ctxT(t, 20*time.Second), tc.argv)
			if err != nil || code != tc.code {
				t.Fatalf("Exec = %q, %d, %v; want exit code %d", out, code, err, tc.code)
			}
			for _, w := range tc.want {
				if !bytes.Contains(out, []byte(w)) {
					t.Fatalf("Exec output %q lacks %q", out, w)
				}
			}
		})
	}
	// The deadline's path: ctx ends once the command has started.
	t.Run("an ended context kills the command", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, _, err := h.Exec(ctx, []string{"sh", "-c", `echo $$ > "$DIR/exec.pid"; exec sleep 1000`})
			errc <- err
		}()
		pid := pidIn(t, filepath.Join(dir, "exec.pid"))
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Exec whose context ended = %v, want context.Canceled", err)
		}
		testutil.Eventually(t, 20*time.Second, "the cancelled exec to be killed", func() bool { return !alive(pid) })
	})
	t.Run("program not found", func(t *testing.T) {
		_, _, err := h.Exec(ctxT(t, 10*time.Second), []string{"no-such-program"})
		if err == nil || !strings.Contains(err.Error(), "no-such-program") {
			t.Fatalf("Exec(no-such-program) = %v, want an error naming it", err)
		}
	})
}

func TestExecStreaming(t *testing.T) {
	cmd, dir := shell(t, "exec sleep 1000")
	h := launch(t, testConfig(t), cmd)
	for _, tc := range []struct {
		name   string
		tty    bool
		argv   []string
		stdin  string
		resize []TermSize
		want   []string
		code   int
	}{
		{"no tty: stdin, env, dir, stderr", false,
			[]string{"sh", "-c", "cat; echo $FOO; pwd; echo oops >&2; test -t 0 || echo notty; exit 2"},
			"hello\n", nil, []string{"hello\n", "bar\n", dir + "\n", "notty"}, 2},
		{"tty: a terminal of the requested size", true,
			[]string{"sh", "-c", "tty; echo $FOO; pwd; stty size; read line; echo got $line"},
			"typed\n", []TermSize{{Height: 33, Width: 111}}, []string{"/dev/pts/", "bar", dir, "33 111", "got typed"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testutil.SyncBuffer
			resize := make(chan TermSize, len(tc.resize))
			for _, r := range tc.resize {
				resize <- r
			}
			code, err := h.ExecStreaming(ctxT(t, 20*time.Second), tc.argv, tc.tty,
				strings.NewReader(tc.stdin), &stdout, &stderr, resize)
			if err != nil || code != tc.code {
				t.Fatalf("ExecStreaming = %d, %v; want %d (stdout %q, stderr %q)", code, err, tc.code, stdout.String(), stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout.String(), w) {
					t.Fatalf("stdout %q lacks %q", stdout.String(), w)
				}
			}
			if !tc.tty && stderr.String() != "oops\n" {
				t.Fatalf("stderr = %q, want oops", stderr.String())
			}
		})
	}
}

func TestUser(t *testing.T) {
	if !isRoot() {
		t.Skip("switching users needs root")
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no account nobody: %v", err)
	}
	gids, err := u.GroupIds()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nobody", u.Uid} {
		t.Run(name, func(t *testing.T) {
			cmd, _ := shell(t, `echo "$(id -u) $(id -g) $(id -G)"; exec sleep 1000`)
			cmd.User, cmd.Dir = name, "/"
			h := launch(t, testConfig(t), cmd)
			want := u.Uid + " " + u.Gid + " " + strings.Join(gids, " ")
			if got := strings.TrimSpace(waitFile(t, cmd.StdoutPath, "\n")); got != want {
				t.Fatalf("engine's ids = %q, want %q", got, want)
			}
			out, _, err := h.Exec(ctxT(t, 10*time.Second), []string{"id", "-u"})
			if err != nil || strings.TrimSpace(string(out)) != u.Uid {
				t.Fatalf("Exec id -u = %q, %v; want %s", out, err, u.Uid)
			}
		})
	}
	t.Run("unknown account", func(t *testing.T) {
		cmd, _ := shell(t, "exit 0")
		cmd.User = "no-such-account-oasis"
		_, err := Launch(ctxT(t, 20*time.Second), testConfig(t), cmd)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "user" || !strings.Contains(err.Error(), "no-such-account-oasis") {
			t.Fatalf("Launch as an unknown account = %v, want a FieldError of user naming it", err)
		}
	})
}

func TestNetNS(t *testing.T) {
	if !isRoot() {
		t.Skip("creating a network namespace needs root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("no ip command (iproute2)")
	}
	name := "oasis-sv-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command(ip, "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "delete", name).Run() })
	nsPath := "/run/netns/" + name
	fi, err := os.Stat(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	want := "net:[" + strconv.FormatUint(fi.Sys().(*syscall.Stat_t).Ino, 10) + "]"
	own, _ := os.Readlink("/proc/self/ns/net")
	if own == want {
		t.Fatal("the test already runs in the new namespace")
	}
	cmd, _ := shell(t, `readlink /proc/self/ns/net; exec sleep 1000`)
	cmd.NetNS = nsPath
	h := launch(t, testConfig(t), cmd)
	if got := strings.TrimSpace(waitFile(t, cmd.StdoutPath, "\n")); got != want {
		t.Fatalf("engine's network namespace = %s, want %s (the test's: %s)", got, want, own)
	}
	out, _, err := h.Exec(ctxT(t, 10*time.Second), []string{"readlink", "/proc/self/ns/net"})
	if err != nil || strings.TrimSpace(string(out)) != want {
		t.Fatalf("exec's network namespace = %q, %v; want %s", out, err, want)
	}
	// The supervisor's other threads stayed in the host namespace: a
	// second exec, on another thread, is in the engine's namespace too,
	// and the supervisor process itself is not.
	sup, _ := os.Readlink("/proc/" + strconv.Itoa(h.State().SupervisorPid) + "/ns/net")
	if sup != own {
		t.Fatalf("supervisor's main thread is in %s, want the host's %s", sup, own)
	}
}

func TestKillLeavesNoProcess(t *testing.T) {
	cfg := testConfig(t)
	cmd, dir := shell(t, `sleep 1000 & echo $! > "$DIR/child"; exec sleep 1000`)
	ctx := ctxT(t, 30*time.Second)
	t.Setenv(launcherEnv+"_PROBE", "x")
	h, err := Launch(ctx, cfg, cmd)
	if err != nil {
		t.Fatal(err)
	}
	child := pidIn(t, filepath.Join(dir, "child"))
	st := h.State()
	// The supervisor has the Go runtime's variables of the driver's
	// environment only.
	if env, _ := os.ReadFile("/proc/" + strconv.Itoa(st.SupervisorPid) + "/environ"); bytes.Contains(env, []byte(launcherEnv)) || bytes.Contains(env, []byte("FOO=bar")) {
		t.Errorf("supervisor's environment %q holds more than the Go runtime's variables", env)
	}
	// ps (and the test bed's sweep of leftovers) tells the task by its log file.
	if cl, _ := os.ReadFile("/proc/" + strconv.Itoa(st.SupervisorPid) + "/cmdline"); !bytes.Contains(cl, []byte("\x00supervisor\x00"+cfg.LogFile)) {
		t.Errorf("supervisor's command line %q does not name its log file %s", cl, cfg.LogFile)
	}
	if err := h.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	for what, pid := range map[string]int{"supervisor": st.SupervisorPid, "engine": st.EnginePid, "engine's child": child} {
		if alive(pid) {
			t.Errorf("%s (pid %d) outlived Kill", what, pid)
		}
	}
	if _, err := os.Stat(st.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s left behind: %v", st.Socket, err)
	}
	if _, err := Reattach(ctx, cfg, st); !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), st.Socket) {
		t.Fatalf("Reattach after Kill = %v, want ErrUnreachable naming the socket", err)
	}
}

// TestKillWhileWaiting is the driver's DestroyTask while its waitProcess
// Waits: the Wait returns (the status, or an error if the supervisor
// exited before sending it) and Kill leaves nothing.
func TestKillWhileWaiting(t *testing.T) {
	cmd, _ := shell(t, "exec sleep 1000")
	h, err := Launch(ctxT(t, 30*time.Second), testConfig(t), cmd)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		ps  *ProcessState
		err error
	}
	waited := make(chan result, 1)
	go func() {
		ps, err := h.Wait(context.Background())
		waited <- result{ps, err}
	}()
	if err := h.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	select {
	case r := <-waited:
		if r.err == nil && r.ps.Signal != 9 {
			t.Fatalf("Wait during Kill = %+v, want SIGKILL", r.ps)
		}
	case <-ctxT(t, 20*time.Second).Done():
		t.Fatal("Wait still blocked after Kill")
	}
	if alive(h.Pid()) || alive(h.State().SupervisorPid) {
		t.Fatal("engine or supervisor outlived Kill")
	}
}

// TestSupervisorKilled: a SIGKILLed supervisor takes its engine with it
// (Pdeathsig, also for an engine that switched users: Go sets it after
// setuid, which clears it); Destroy removes the rest of the engine's group.
func TestSupervisorKilled(t *testing.T) {
	users := []string{""}
	if isRoot() {
		users = append(users, "nobody")
	}
	for _, name := range users {
		t.Run("user "+strconv.Quote(name), func(t *testing.T) {
			cfg := testConfig(t)
			// The child's pid goes to stdout, which the supervisor opens
			// (nobody may not write the test's directory).
			cmd, _ := shell(t, `sleep 1000 & echo $!; exec sleep 1000`)
			cmd.User, cmd.Dir = name, "/"
			h := launch(t, cfg, cmd)
			child := pidIn(t, cmd.StdoutPath)
			st := h.State()
			if err := syscall.Kill(st.SupervisorPid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 20*time.Second, "the engine to die with its supervisor", func() bool { return !alive(st.EnginePid) })
			_, err := Reattach(ctxT(t, 10*time.Second), cfg, st)
			var ce *ConnectError
			if !errors.As(err, &ce) || ce.Socket != st.Socket {
				t.Fatalf("Reattach to a dead supervisor = %v, want a ConnectError naming %s", err, st.Socket)
			}
			if err := Destroy(ctxT(t, 20*time.Second), st); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			if alive(child) {
				t.Fatalf("engine's child %d outlived Destroy", child)
			}
		})
	}
}

// TestSupervisorTerminated: SIGTERM to the supervisor kills the engine's
// group and ends the supervisor.
func TestSupervisorTerminated(t *testing.T) {
	cmd, dir := shell(t, `sleep 1000 & echo $! > "$DIR/child"; exec sleep 1000`)
	h := launch(t, testConfig(t), cmd)
	child := pidIn(t, filepath.Join(dir, "child"))
	st := h.State()
	if err := syscall.Kill(st.SupervisorPid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "supervisor, engine and child gone", func() bool {
		return !alive(st.SupervisorPid) && !alive(st.EnginePid) && !alive(child)
	})
}

// TestOutputFIFOs: the engine's output goes to FIFOs, as Nomad's logmon
// hands them; the supervisor opens them for writing once a reader has.
func TestOutputFIFOs(t *testing.T) {
	cmd, dir := shell(t, "echo to-stdout; echo to-stderr >&2")
	read := map[string]chan string{}
	for _, name := range []string{"stdout.fifo", "stderr.fifo"} {
		p := filepath.Join(dir, name)
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
		ch := make(chan string, 1)
		read[name] = ch
		go func() { b, _ := os.ReadFile(p); ch <- string(b) }() // until every writer closed
	}
	cmd.StdoutPath, cmd.StderrPath = filepath.Join(dir, "stdout.fifo"), filepath.Join(dir, "stderr.fifo")
	h := launch(t, testConfig(t), cmd)
	if ps := wait(t, h); ps.ExitCode != 0 {
		t.Fatalf("Wait = %+v", ps)
	}
	for name, want := range map[string]string{"stdout.fifo": "to-stdout\n", "stderr.fifo": "to-stderr\n"} {
		select {
		case got := <-read[name]:
			if got != want {
				t.Errorf("%s read %q, want %q", name, got, want)
			}
		case <-ctxT(t, 20*time.Second).Done():
			t.Fatalf("%s never reached EOF: the supervisor kept its write end open", name)
		}
	}
}

// TestLaunchFIFOWithoutReader: the supervisor blocks opening a FIFO nobody
// reads; Launch gives up when its ctx ends and leaves no process.
func TestLaunchFIFOWithoutReader(t *testing.T) {
	cfg := testConfig(t)
	cmd, dir := shell(t, "exit 0")
	cmd.StdoutPath = filepath.Join(dir, "stdout.fifo")
	if err := syscall.Mkfifo(cmd.StdoutPath, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := Launch(ctx, cfg, cmd); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Launch = %v, want DeadlineExceeded", err)
	}
	for _, p := range allProcs() {
		if cl, _ := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/cmdline"); bytes.Contains(cl, []byte(cfg.LogFile)) && p.state != 'Z' {
			t.Fatalf("supervisor %d outlived the failed Launch", p.pid)
		}
	}
	if ents, _ := os.ReadDir(cfg.SocketDir); len(ents) != 0 {
		t.Fatalf("the failed Launch left %s in the socket directory", ents[0].Name())
	}
}

func TestLaunchErrors(t *testing.T) {
	long := strings.Repeat("a", MaxArgBytes+1)
	for _, tc := range []struct {
		name  string
		edit  func(*Command)
		field string
	}{
		{"relative path", func(c *Command) { c.Path = "sh" }, "path"},
		{"no path", func(c *Command) { c.Path = "" }, "path"},
		{"NUL in an argument", func(c *Command) { c.Args = []string{"-c", "a\x00b"} }, "args[1]"},
		{"argument too long", func(c *Command) { c.Args = []string{long} }, "args[0]"},
		{"too many arguments", func(c *Command) { c.Args = make([]string, MaxArgs+1) }, "args"},
		{"env entry without =", func(c *Command) { c.Env = []string{"A=1", "B"} }, "env[1]"},
		{"env entry with empty name", func(c *Command) { c.Env = []string{"=x"} }, "env[0]"},
		{"relative dir", func(c *Command) { c.Dir = "local" }, "dir"},
		{"relative stdout", func(c *Command) { c.StdoutPath = "out" }, "stdout_path"},
		{"NUL in netns", func(c *Command) { c.NetNS = "/run/netns/a\x00" }, "netns"},
		{"user with a colon", func(c *Command) { c.User = "a:b" }, "user"},
		{"total too large", func(c *Command) {
			c.Args = nil
			for i := 0; i < 9; i++ {
				c.Args = append(c.Args, strings.Repeat("a", MaxArgBytes))
			}
		}, "args"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, _ := shell(t, "exit 0")
			tc.edit(&cmd)
			_, err := Launch(context.Background(), testConfig(t), cmd)
			var fe *FieldError
			if !errors.Is(err, ErrInvalidCommand) || !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("Launch = %v, want a FieldError of %s", err, tc.field)
			}
		})
	}
	t.Run("missing program", func(t *testing.T) {
		cmd, _ := shell(t, "")
		cmd.Path = "/nonexistent/engine"
		_, err := Launch(ctxT(t, 20*time.Second), testConfig(t), cmd)
		if err == nil || !strings.Contains(err.Error(), "/nonexistent/engine") {
			t.Fatalf("Launch = %v, want an error naming the program", err)
		}
	})
	t.Run("socket path too long", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.SocketDir = filepath.Join(t.TempDir(), strings.Repeat("d", 100))
		cmd, _ := shell(t, "exit 0")
		_, err := Launch(ctxT(t, 20*time.Second), cfg, cmd)
		if err == nil || !strings.Contains(err.Error(), "socket path") {
			t.Fatalf("Launch = %v, want the socket path refused", err)
		}
	})
	t.Run("exec argv", func(t *testing.T) {
		if err := checkArgv(nil); err == nil || !strings.Contains(err.Error(), "command") {
			t.Fatalf("checkArgv(nil) = %v", err)
		}
		var fe *FieldError
		if err := checkArgv([]string{"sh", "a\x00"}); !errors.As(err, &fe) || fe.Field != "command[1]" {
			t.Fatalf("checkArgv(NUL) = %v, want command[1]", err)
		}
	})
}

func TestSocketDirRefusesOthers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "socks")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ensureSocketDir(dir); err != nil {
		t.Fatalf("ensureSocketDir: %v", err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory mode %v, want 0700", fi.Mode().Perm())
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := ensureSocketDir(link); err == nil {
		t.Fatal("ensureSocketDir accepted a symlink")
	}
	if isRoot() {
		other := filepath.Join(t.TempDir(), "other")
		if err := os.Mkdir(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := ensureSocketDir(other); err == nil || !strings.Contains(err.Error(), "owned") {
			t.Fatalf("ensureSocketDir(dir of another user) = %v", err)
		}
	}
}
