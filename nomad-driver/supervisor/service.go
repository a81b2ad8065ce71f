//go:build linux

package supervisor

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/oasis-llm/oasis/nomad-driver/supervisor/internal/wire"
)

// errEngineExited is the server's text for a signal to an engine that has
// exited; the client maps it back to ErrEngineExited.
const errEngineExited = "engine has exited"

// ErrEngineExited is Signal's error once the engine has exited.
var ErrEngineExited = errors.New(errEngineExited)

// service is the net/rpc service "Supervisor".
type service struct{ s *server }

// Hello identifies the supervisor.
func (v *service) Hello(_ wire.Empty, r *wire.Hello) error {
	*r = wire.Hello{Version: wire.Version, Pid: syscall.Getpid(), EnginePid: v.s.engine.pid,
		EngineStart: v.s.engine.start, Exited: v.s.exited()}
	return nil
}

// Wait blocks until the engine has exited and returns how. The supervisor
// keeps the status for every later Wait until Kill.
func (v *service) Wait(_ wire.Empty, r *wire.Exit) error {
	<-v.s.engine.done
	e := v.s.engine.exit
	*r = wire.Exit{Pid: e.Pid, ExitCode: e.ExitCode, Signal: e.Signal, Time: e.Time}
	return nil
}

// Signal sends sig to the engine (the process, not its group, as Nomad's
// executor does).
func (v *service) Signal(sig int, _ *wire.Empty) error {
	if sig <= 0 || sig > 64 {
		return fmt.Errorf("%w %d", ErrUnknownSignal, sig)
	}
	if v.s.exited() {
		return errors.New(errEngineExited)
	}
	if err := syscall.Kill(v.s.engine.pid, syscall.Signal(sig)); err != nil {
		return fmt.Errorf("signalling engine (pid %d): %w", v.s.engine.pid, err)
	}
	return nil
}

// Shutdown stops the engine (see server.shutdown).
func (v *service) Shutdown(a wire.ShutdownArgs, _ *wire.Empty) error {
	v.s.logger.Info("shutdown requested", "signal", a.Signal, "grace", a.Grace)
	return v.s.shutdown(a.Signal, a.Grace)
}

// Stats samples the engine's process tree.
func (v *service) Stats(_ wire.Empty, r *wire.Sample) error {
	*r = sampleTree(v.s.engine.pid, v.s.engine.start)
	r.CoreMHz = v.s.mhz
	return nil
}

// Kill SIGKILLs the engine's process group and ends the supervisor.
func (v *service) Kill(_ wire.Empty, _ *wire.Empty) error {
	v.s.logger.Info("kill requested")
	err := v.s.shutdown("", 0)
	v.s.quitOnce.Do(func() { close(v.s.quit) })
	return err
}
