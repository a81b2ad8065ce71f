//go:build linux

package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

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
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procInfo{}, fmt.Errorf("parsing /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 22 {
		return procInfo{}, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	num := func(idx int) uint64 { n, _ := strconv.ParseUint(f[idx], 10, 64); return n }
	return procInfo{
		pid: pid, ppid: int(num(1)), pgrp: int(num(2)), state: f[0][0],
		utime: num(11), stime: num(12), start: num(19), rssPages: num(21),
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
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make([]procInfo, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := readProc(pid); err == nil {
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
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmSwap:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// coreMHz is the mean "cpu MHz" of /proc/cpuinfo's CPUs; 0 if unknown.
// Nomad's TotalTicks is Percent/100 of it (its CpuStats.TicksConsumed:
// percent of one core × the node's MHz / its cores).
func coreMHz() float64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	var sum float64
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			sum += mhz
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
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
