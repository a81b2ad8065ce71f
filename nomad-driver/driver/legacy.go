package driver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"github.com/prometheus/procfs"
)

// legacyExecutor is what a task handle written by an older nomad-driver-llm
// (built on Nomad's executor, before Oasis spoke the plugin protocol
// itself) says about the executor that runs its engine: go-plugin's
// reattach config, of which only the executor's pid matters here.
type legacyExecutor struct {
	Pid int
}

// errLegacyHandle is RecoverTask's error for such a handle: this driver
// cannot reattach to Nomad's executor, so the client restarts the task.
var errLegacyHandle = errors.New("its driver state names Nomad's executor (started by an older nomad-driver-llm), not a supervisor")

// endLegacyEngine SIGKILLs the engine of an older driver's task (its
// process group) and its executor, so the task the client restarts in its
// place finds its ports free. It acts only where /proc confirms both: the
// executor runs "<binary> executor ..." and is the engine's parent; pids
// from before a reboot name nothing or something else, and are left alone.
func endLegacyEngine(exec *legacyExecutor, enginePid int) error {
	if exec == nil || exec.Pid <= 1 || enginePid <= 1 {
		return errors.New("no executor or engine pid")
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(exec.Pid) + "/cmdline")
	if err != nil {
		return fmt.Errorf("executor %d: %w", exec.Pid, err)
	}
	if args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0}); len(args) < 2 || string(args[1]) != "executor" {
		return fmt.Errorf("process %d is not an executor", exec.Pid)
	}
	if ppid, err := parentPid(enginePid); err != nil || ppid != exec.Pid {
		return fmt.Errorf("process %d is not the executor's engine", enginePid)
	}
	if pgid, err := syscall.Getpgid(enginePid); err == nil && pgid == enginePid {
		_ = syscall.Kill(-enginePid, syscall.SIGKILL)
	}
	_ = syscall.Kill(enginePid, syscall.SIGKILL)
	// An executor whose engine just died may exit on its own first (ESRCH): gone is what this
	// is for.
	if err := syscall.Kill(exec.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("ending executor %d: %w", exec.Pid, err)
	}
	return nil
}

// parentPid reads a process's parent from /proc/PID/stat.
func parentPid(pid int) (int, error) {
	proc, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := proc.Stat()
	if err != nil {
		return 0, err
	}
	return st.PPID, nil
}
