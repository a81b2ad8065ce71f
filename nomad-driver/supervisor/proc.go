//go:build linux

package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
	"github.com/oasis-llm/oasis/nomad-driver/supervisor/internal/wire"
)

// clkTck is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clkTck = 100

// procInfo is what the supervisor reads of /proc/PID/stat.
type procInfo struct {
	pid, ppid, pgrp int
	state           byte
	utime, stime    uint64 // clock ticks
	start           uint64 // clock ticks after boot
	rssPages        uint64
}

func readProc(pid int) (procInfo, error) {
	proc, err := procfs.NewProc(pid)
	if err != nil {
		return procInfo{}, err
	}
	return statInfo(proc)
}

// statInfo reads a process's /proc/PID/stat.
func statInfo(proc procfs.Proc) (procInfo, error) {
	st, err := proc.Stat()
	if err != nil {
		return procInfo{}, err
	}
	var state byte
	if st.State != "" {
		state = st.State[0]
	}
	return procInfo{
		pid: st.PID, ppid: st.PPID, pgrp: st.PGRP, state: state,
		utime: uint64(st.UTime), stime: uint64(st.STime), start: st.Starttime, rssPages: uint64(max(st.RSS, 0)),
	}, nil
}

// startTicks is a process's start time, 0 if it is gone.
func startTicks(pid int) uint64 {
	p, err := readProc(pid)
	if err != nil {
		return 0
	}
	return p.start
}

// running reports whether pid is the process that started at start and has
// not exited (a zombie has).
func running(pid int, start uint64) bool {
	p, err := readProc(pid)
	return err == nil && p.start == start && p.state != 'Z' && p.state != 'X'
}

// allProcs reads every process of /proc.
func allProcs() []procInfo {
	procs, err := procfs.AllProcs()
	if err != nil {
		return nil
	}
	out := make([]procInfo, 0, len(procs))
	for _, proc := range procs {
		if p, err := statInfo(proc); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// treeOf is the engine's live process tree: the engine, its descendants,
// and the members of its process group started no earlier than it.
func treeOf(pid int, start uint64) []procInfo {
	procs := allProcs()
	children := make(map[int][]int, len(procs))
	byPid := make(map[int]procInfo, len(procs))
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
		byPid[p.pid] = p
	}
	in := map[int]bool{}
	var walk func(int)
	walk = func(p int) {
		if in[p] {
			return
		}
		in[p] = true
		for _, c := range children[p] {
			walk(c)
		}
	}
	if e, ok := byPid[pid]; ok && e.start == start {
		walk(pid)
	}
	for _, p := range procs {
		if p.pgrp == pid && p.start >= start {
			walk(p.pid)
		}
	}
	out := make([]procInfo, 0, len(in))
	for p := range in {
		if info := byPid[p]; info.state != 'Z' && info.state != 'X' {
			out = append(out, info)
		}
	}
	return out
}

// sampleTree reads the counters of the engine's process tree; the client
// turns two samples into a Usage.
func sampleTree(pid int, start uint64) wire.Sample {
	s := wire.Sample{Time: time.Now()}
	page := uint64(os.Getpagesize())
	for _, p := range treeOf(pid, start) {
		s.Pids++
		s.UserTicks += p.utime
		s.SystemTicks += p.stime
		s.RSS += p.rssPages * page
		s.Swap += swapOf(p.pid)
	}
	return s
}

// swapOf is VmSwap of /proc/PID/status in bytes.
func swapOf(pid int) uint64 {
	proc, err := procfs.NewProc(pid)
	if err != nil {
		return 0
	}
	st, err := proc.NewStatus()
	if err != nil {
		return 0
	}
	return st.VmSwap
}

// coreMHz is the mean "cpu MHz" of /proc/cpuinfo's CPUs; 0 if unknown.
// Nomad's TotalTicks is Percent/100 of it (its CpuStats.TicksConsumed:
// percent of one core × the node's MHz / its cores).
func coreMHz() float64 {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0
	}
	cpus, err := fs.CPUInfo()
	if err != nil || len(cpus) == 0 {
		return 0
	}
	var sum float64
	for _, c := range cpus {
		sum += c.CPUMHz
	}
	return sum / float64(len(cpus))
}

// groupMembers lists the live processes of process group pgid started no
// earlier than notBefore.
func groupMembers(pgid int, notBefore uint64) []int {
	var out []int
	for _, p := range allProcs() {
		if p.pgrp == pgid && p.start >= notBefore && p.state != 'Z' && p.state != 'X' {
			out = append(out, p.pid)
		}
	}
	return out
}

// pollGap is how often the supervisor and its clients look at /proc while
// they wait for processes to end.
const pollGap = 10 * time.Millisecond

// until checks cond every pollGap until it holds (nil) or ctx ends.
func until(ctx context.Context, cond func() bool) error {
	for !cond() {
		if err := ctxsleep.Sleep(ctx, pollGap); err != nil {
			return err
		}
	}
	return nil
}

// killGroup SIGKILLs process group pgid until none of its members started
// at or after notBefore is left, or ctx ends. While one such member lives
// the group id cannot belong to anyone else, so kill(-pgid) is safe.
func killGroup(ctx context.Context, pgid int, notBefore uint64) error {
	var killErr error
	err := until(ctx, func() bool {
		if len(groupMembers(pgid, notBefore)) == 0 {
			return true
		}
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			killErr = fmt.Errorf("killing process group %d: %w", pgid, err)
			return true
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("process group %d still has members %v: %w", pgid, groupMembers(pgid, notBefore), err)
	}
	return killErr
}
