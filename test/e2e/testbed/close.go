package testbed

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// Close stops every job, the Nomad agent, any task or engine supervisor process the stack started, its
// cgroups, the Consul agent, and removes Dir. It keeps going past errors and returns them all.
// It is safe to call on a partially started stack.
func (s *Stack) Close() error {
	var errs []error
	// A frozen agent (Freeze) would sit out its grace period without handling SIGINT.
	for _, p := range []*process{s.consul, s.nomad} {
		if p != nil && !p.exited() {
			_ = syscall.Kill(p.pid, syscall.SIGCONT)
		}
	}
	if s.nomad != nil && !s.nomad.exited() && s.Nomad != nil {
		if err := s.stopAllJobs(); err != nil {
			errs = append(errs, err)
		}
		if err := s.waitNetworksTornDown(30 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	// The agent's plugin processes (logmon, engine supervisors) run in process groups
	// of their own and outlive it, and a logmon's command line and working
	// directory do not name Dir: remember the agent's process tree to end it.
	var tree map[int]uint64
	if s.nomad != nil && !s.nomad.exited() {
		tree = descendants(s.nomad.pid)
	}
	if err := stopProcess(s.nomad, 20*time.Second); err != nil {
		errs = append(errs, fmt.Errorf("stopping nomad: %w", err))
	}
	// Consul goes after Nomad, which deregisters its services on the way out, and before the
	// sweep below, which would otherwise find it by its command line.
	if err := stopProcess(s.consul, 10*time.Second); err != nil {
		errs = append(errs, fmt.Errorf("stopping consul: %w", err))
	}
	if err := killTree(tree); err != nil {
		errs = append(errs, err)
	}
	if err := s.killLeftovers(); err != nil {
		errs = append(errs, err)
	}
	if err := s.removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := s.unmountAll(); err != nil {
		errs = append(errs, err)
	}
	if err := s.bridge.remove(); err != nil {
		errs = append(errs, err)
	}
	if s.Dir != "" && os.Getenv("OASIS_TESTBED_KEEP") == "" {
		if err := os.RemoveAll(s.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", s.Dir, err))
		}
	}
	if err := s.leftListening(); err != nil {
		errs = append(errs, err)
	}
	if err := s.ports.Release(); err != nil { // its tasks are gone
		errs = append(errs, fmt.Errorf("releasing the dynamic port window: %w", err))
	}
	return errors.Join(errs...)
}

// leftListening names what still listens in the stack's dynamic port window once everything it
// started is ended: a process no sweep above found, which the next stack to claim the window would
// meet on a port its Nomad hands out (testutil.PortWindows.Claim passes over such a window).
func (s *Stack) leftListening() error {
	if s.ports == nil {
		return nil
	}
	ls, err := testutil.Listeners(s.ports.Min, s.ports.Max)
	if err != nil {
		return fmt.Errorf("checking the dynamic port window %d-%d: %w", s.ports.Min, s.ports.Max, err)
	}
	if len(ls) > 0 {
		return fmt.Errorf("the dynamic port window %d-%d is still listened on after the stack closed: %s",
			s.ports.Min, s.ports.Max, strings.Join(testutil.DescribeListeners(ls), ", "))
	}
	return nil
}

// stopAllJobs deregisters and purges every job and waits (bounded) for their allocations to stop,
// so tasks are ended by Nomad itself — honouring kill_timeout — before the agent goes away.
func (s *Stack) stopAllJobs() error {
	jobs, _, err := s.Nomad.Jobs().List(nil)
	if err != nil {
		return fmt.Errorf("listing jobs to stop: %w", err)
	}
	var allocIDs []string
	for _, j := range jobs {
		allocs, _, err := s.Nomad.Jobs().Allocations(j.ID, true, &nomadapi.QueryOptions{Namespace: j.Namespace})
		if err == nil {
			for _, a := range allocs {
				allocIDs = append(allocIDs, a.ID)
			}
		}
		if _, _, err := s.Nomad.Jobs().Deregister(j.ID, true, &nomadapi.WriteOptions{Namespace: j.Namespace}); err != nil {
			return fmt.Errorf("stopping job %s: %w", j.ID, err)
		}
	}
	return s.waitAllocsTerminal(allocIDs, 30*time.Second)
}

func (s *Stack) waitAllocsTerminal(ids []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, id := range ids {
		for {
			a, _, err := s.Nomad.Allocations().Info(id, nil)
			if err != nil || a.ClientTerminalStatus() {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("allocation %s still %s after %s", id, a.ClientStatus, timeout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// killLeftovers SIGKILLs every process that belongs to this stack but outlived the agent: task
// processes (working directory under Dir) and engine supervisors or plugins (command line naming Dir).
func (s *Stack) killLeftovers() error {
	if s.Dir == "" {
		return nil
	}
	self := os.Getpid()
	var errs []error
	for range 3 {
		pids := s.stackPIDs(self)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("killing leftover process %d: %w", pid, err))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if pids := s.stackPIDs(self); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("processes %v survived SIGKILL", pids))
	}
	return errors.Join(errs...)
}

// descendants returns every process below root (children, their children,
// ...) with its start time, so that killTree cannot hit a reused pid.
func descendants(root int) map[int]uint64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	starts := map[int]uint64{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, start, ok := procStat(pid); ok {
			children[ppid] = append(children[ppid], pid)
			starts[pid] = start
		}
	}
	out := map[int]uint64{}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if _, seen := out[c]; !seen {
				out[c] = starts[c]
				queue = append(queue, c)
			}
		}
	}
	return out
}

// killTree SIGKILLs the processes of tree that are still the same processes.
func killTree(tree map[int]uint64) error {
	var errs []error
	for pid, start := range tree {
		if _, now, ok := procStat(pid); !ok || now != start {
			continue // gone, or the pid was reused
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("killing agent child %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// procStat reads a process's parent pid and start time (clock ticks since
// boot) from /proc/<pid>/stat.
func procStat(pid int) (ppid int, start uint64, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses and may hold spaces or ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is the state (field 3); ppid is field 4, starttime field 22.
	if len(f) < 20 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	return ppid, start, err1 == nil && err2 == nil
}

func (s *Stack) stackPIDs(self int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	prefix := s.Dir + string(filepath.Separator)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && (cwd == s.Dir || strings.HasPrefix(cwd, prefix)) {
			pids = append(pids, pid)
			continue
		}
		if cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && bytes.Contains(cmdline, []byte(prefix)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeCgroups removes the cgroups Nomad made for this stack's tasks. Nomad 1.11 ignores the
// client's cgroup_parent and always uses /nomad (cgroups v1) or nomad.slice (v2), so stacks on
// one machine share that parent: the task scopes (named after allocation ids) are removed, and
// the parent itself only when no other Nomad agent is running that could still be using it.
func (s *Stack) removeCgroups() error {
	allocs, _ := os.ReadDir(filepath.Join(s.nomadDataDir(), "alloc"))
	var ids []string
	for _, a := range allocs {
		ids = append(ids, a.Name())
	}
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/nomad")
	if isDir("/sys/fs/cgroup/nomad.slice") {
		parents = append(parents, "/sys/fs/cgroup/nomad.slice")
	}
	removeParent := !otherNomadAgents()
	var errs []error
	for _, parent := range parents {
		var dirs []string
		filepath.WalkDir(parent, func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			for _, id := range ids {
				if strings.Contains(filepath.Base(path), id) {
					dirs = append(dirs, path)
					return nil
				}
			}
			if removeParent {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := rmdirCgroup(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func rmdirCgroup(path string) error {
	var err error
	for range 20 { // a cgroup stays busy for a moment after its last process exits
		if err = syscall.Rmdir(path); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", path, err)
}

// otherNomadAgents reports whether any `nomad agent` process is running on the machine.
func otherNomadAgents() bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(cmdline, []byte{0})
		if len(args) > 1 && filepath.Base(string(args[0])) == "nomad" && string(args[1]) == "agent" {
			return true
		}
	}
	return false
}

// unmountAll detaches any mount Nomad left under Dir (secrets tmpfs, alloc dir binds).
func (s *Stack) unmountAll() error {
	if s.Dir == "" {
		return nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], s.Dir+string(filepath.Separator)) {
			mounts = append(mounts, fields[4])
		}
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mounts[i], err))
		}
	}
	return errors.Join(errs...)
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
