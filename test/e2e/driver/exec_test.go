package driver

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// TestAllocExecSignalStats drives the calls of Nomad's CLI that reach a
// running llm task through the driver protocol on a real agent: `nomad
// alloc exec` (streaming exec, with stdin, and with a terminal), `nomad
// alloc signal`, and `nomad alloc status -stats` (the driver's TaskStats).
func TestAllocExecSignalStats(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const jobID = "oasis-driver-exec"
	_, err := stack.RunJobHCL(ctx, simJob(jobID, ""))
	must.NoError(t, err)
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), jobID) })
	alloc := runningAlloc(t, ctx, jobID)
	waitEvent(t, alloc.ID, "Engine ready after")

	// stdin reaches the command, which runs in the task's environment and
	// directory; stdout and stderr come back apart, as does the exit code.
	var stdout, stderr bytes.Buffer
	code, err := stack.Nomad.Allocations().Exec(ctx, alloc, "engine", false,
		[]string{"/bin/sh", "-c", `echo "task=$NOMAD_TASK_NAME dir=$(pwd)"; cat; echo oops >&2; exit 3`},
		strings.NewReader("hello from stdin\n"), &stdout, &stderr, nil, nil)
	must.NoError(t, err)
	must.EqOp(t, 3, code)
	must.StrContains(t, stdout.String(), "task=engine dir=")
	must.StrContains(t, stdout.String(), "/engine\n")
	must.StrContains(t, stdout.String(), "hello from stdin\n")
	must.EqOp(t, "oops\n", stderr.String())

	// With a terminal, stdin is a tty of the size the client asked for. The
	// size travels on the exec stream beside the command's start, so it can
	// reach the terminal just after the command began: the command waits for
	// it (5 s at most) before printing it.
	sizes := make(chan nomadapi.TerminalSize, 1)
	sizes <- nomadapi.TerminalSize{Height: 33, Width: 101}
	stdout.Reset()
	code, err = stack.Nomad.Allocations().Exec(ctx, alloc, "engine", true,
		[]string{"/bin/sh", "-c", `test -t 0 && echo is-a-tty; i=0; while [ "$(stty size)" = "0 0" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; stty size`},
		strings.NewReader(""), &stdout, &stderr, sizes, nil)
	must.NoError(t, err)
	must.EqOp(t, 0, code)
	must.StrContains(t, stdout.String(), "is-a-tty")
	must.StrContains(t, stdout.String(), "33 101")

	// A signal the engine ignores reaches it without an error; an unknown
	// one is refused.
	must.NoError(t, stack.Nomad.Allocations().Signal(alloc, nil, "engine", "SIGCONT"))
	must.Error(t, stack.Nomad.Allocations().Signal(alloc, nil, "engine", "SIGNOPE"))

	// The client's stats of the task come from the driver's stream.
	testutil.EventuallyEvery(t, 30*time.Second, 250*time.Millisecond, "the task's memory stats", func() bool {
		u, err := stack.Nomad.Allocations().Stats(alloc, nil)
		if err != nil || u.Tasks["engine"] == nil || u.Tasks["engine"].ResourceUsage == nil {
			return false
		}
		ms := u.Tasks["engine"].ResourceUsage.MemoryStats
		return ms != nil && ms.RSS > 0
	})
}
