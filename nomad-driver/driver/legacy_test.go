package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// TestLegacyHandleEndsTheOldEngine: a handle of an older driver (Nomad's
// executor) decodes, RecoverTask's cleanup SIGKILLs its engine's group and
// its executor, and leaves processes that are not such a pair alone.
func TestLegacyHandleEndsTheOldEngine(t *testing.T) {
	dir := t.TempDir()
	// "sh executor {}" stands in for "<plugin> executor <json>"; its child
	// leads its own process group, as the executor's engine does.
	must.NoError(t, os.WriteFile(filepath.Join(dir, "executor"), []byte("setsid sleep 300 &\nwait\n"), 0o755))
	cmd := exec.Command("/bin/sh", "executor", "{}")
	cmd.Dir = dir
	must.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var engine int
	testutil.Eventually(t, 5*time.Second, "the stand-in engine to start", func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/task/" + strconv.Itoa(cmd.Process.Pid) + "/children")
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return false
		}
		engine, _ = strconv.Atoi(f[0])
		pg, err := syscall.Getpgid(engine)
		return err == nil && pg == engine
	})
	t.Cleanup(func() { _ = syscall.Kill(engine, syscall.SIGKILL) })

	// The old driver's state, as its msgpack keys name it.
	old := struct {
		ReattachConfig *struct {
			Protocol, Network, Addr string
			Pid                     int
		}
		Pid    int
		Engine string
	}{Pid: engine, Engine: "sim"}
	old.ReattachConfig = &struct {
		Protocol, Network, Addr string
		Pid                     int
	}{"grpc", "unix", "/tmp/plugin123", cmd.Process.Pid}
	var raw []byte
	must.NoError(t, base.MsgPackEncode(&raw, &old))
	var st TaskState
	must.NoError(t, base.MsgPackDecode(raw, &st))
	must.Nil(t, st.Supervisor)
	must.NotNil(t, st.LegacyExecutor)

	must.Error(t, endLegacyEngine(&legacyExecutor{Pid: os.Getpid()}, engine), must.Sprint("the test process is no executor"))
	must.Error(t, endLegacyEngine(st.LegacyExecutor, os.Getpid()), must.Sprint("the test process is not the executor's engine"))
	must.True(t, alive(engine))

	must.NoError(t, endLegacyEngine(st.LegacyExecutor, st.Pid))
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the executor survived")
	}
	testutil.Eventually(t, 5*time.Second, "the engine to die", func() bool { return !alive(engine) || isZombie(engine) })
}

func isZombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && strings.Contains(string(stat), ") Z ")
}
