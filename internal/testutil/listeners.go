package testutil

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// tcpListen is the state column of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// Listener is a listening TCP socket of this network namespace: its port,
// and the inode a process's /proc/<pid>/fd links name it by ("socket:[N]").
type Listener struct {
	Port  int
	Inode uint64
}

// Listeners returns the TCP sockets that listen on a port from lo to hi
// (IPv4 or IPv6, any address), read from /proc/net/tcp and /proc/net/tcp6;
// a table the kernel does not have (no IPv6) counts as empty.
func Listeners(lo, hi int) ([]Listener, error) {
	var all []Listener
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		got, err := listenersIn(f, lo, hi)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", table, err)
		}
		all = append(all, got...)
	}
	return all, nil
}

// listenerPorts returns the listeners' ports, sorted and without repeats.
func listenerPorts(ls []Listener) []int {
	ports := make([]int, len(ls))
	for i, l := range ls {
		ports[i] = l.Port
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

// listenersIn parses one /proc/net/tcp table: a header line, then a line
// per socket, "sl local_address rem_address st tx:rx tr:when retrnsmt uid
// timeout inode ...", addresses as hex ADDR:PORT.
func listenersIn(r io.Reader, lo, hi int) ([]Listener, error) {
	var ls []Listener
	sc := bufio.NewScanner(r)
	for first := true; sc.Scan(); first = false {
		fields := strings.Fields(sc.Text())
		if first || len(fields) < 10 || fields[3] != tcpListen {
			continue
		}
		i := strings.LastIndexByte(fields[1], ':')
		if i < 0 {
			return nil, fmt.Errorf("local address %q has no port", fields[1])
		}
		port, err := strconv.ParseUint(fields[1][i+1:], 16, 16)
		if err != nil {
			return nil, fmt.Errorf("local address %q: %w", fields[1], err)
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("inode %q: %w", fields[9], err)
		}
		if p := int(port); p >= lo && p <= hi {
			ls = append(ls, Listener{Port: p, Inode: inode})
		}
	}
	return ls, sc.Err()
}

// DescribeListeners names each listener's port and the processes holding
// its socket ("20123 (pid 4242: /path/to/cmd --flag ...)"), found through
// /proc/<pid>/fd; a process this one cannot read is left out.
func DescribeListeners(ls []Listener) []string {
	owners := socketOwners()
	out := make([]string, len(ls))
	for i, l := range ls {
		var who []string
		for _, pid := range owners[l.Inode] {
			cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
			if len(line) > 200 {
				line = line[:200] + " ..."
			}
			who = append(who, fmt.Sprintf("pid %d: %s", pid, line))
		}
		if len(who) == 0 {
			who = []string{"no process found"}
		}
		out[i] = fmt.Sprintf("%d (%s)", l.Port, strings.Join(who, "; "))
	}
	return out
}

// socketOwners maps socket inodes to the pids whose file descriptors hold
// them.
func socketOwners() map[uint64][]int {
	owners := map[uint64][]int{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			inode, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
			if err == nil && !slices.Contains(owners[inode], pid) {
				owners[inode] = append(owners[inode], pid)
			}
		}
	}
	return owners
}
