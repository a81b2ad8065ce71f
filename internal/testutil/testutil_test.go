package testutil

import (
	"net"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestStopReportsHowTheProcessExited(t *testing.T) {
	ok := Start(t, exec.Command("sh", "-c", "echo out; echo err >&2"))
	Eventually(t, 5*time.Second, "sh to exit", ok.Exited)
	must.NoError(t, ok.Stop())
	must.StrContains(t, ok.Output(), "out\n")
	must.StrContains(t, ok.Output(), "err\n")

	// SIGTERM ends sleep, so Stop returns without killing.
	sleep := Start(t, exec.Command("sleep", "60"))
	must.ErrorContains(t, sleep.Stop(), "signal: terminated")
	must.True(t, sleep.Exited())
}

func TestRefusingAddrRefusesAndKeepsItsPort(t *testing.T) {
	addr, release := RefusingAddr(t)
	_, err := net.Dial("tcp", addr)
	must.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = net.Listen("tcp", addr) // nobody else may serve it meanwhile
	must.Error(t, err)
	release()
	ln, err := net.Listen("tcp", addr)
	must.NoError(t, err)
	ln.Close()
}
