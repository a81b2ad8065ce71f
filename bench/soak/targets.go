package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/oasis-llm/oasis/test/e2e/localstack"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// targets are where the soak sends its load and reads its samples.
type targets struct {
	routerURL    string // http://host:port
	routerBin    string
	kvcachedAddr string // RESP host:port
	kvcachedPass string // the password make up gave it
	kvcachedHTTP string // /metrics host:port
	kvcachedBin  string
	model        string
}

func findTargets(s *testbed.Stack) (targets, error) {
	t := targets{routerBin: s.Bin("oasis-router"), kvcachedBin: s.Bin("oasis-kvcached"), model: "tiny-sim"}
	routers, _, err := s.Consul.Health().Service("oasis-router", "", true, nil)
	if err != nil || len(routers) == 0 {
		return t, fmt.Errorf("no passing oasis-router in Consul (%v)", err)
	}
	r := routers[0].Service
	t.routerURL = "http://" + net.JoinHostPort(r.Address, strconv.Itoa(r.Port))
	kcs, _, err := s.Consul.Health().Service("oasis-kvcached", "", true, nil)
	if err != nil || len(kcs) == 0 {
		return t, fmt.Errorf("no passing oasis-kvcached in Consul (%v)", err)
	}
	k := kcs[0].Service
	t.kvcachedAddr = net.JoinHostPort(k.Address, strconv.Itoa(k.Port))
	t.kvcachedHTTP = k.Meta["oasis_metrics_addr"]
	if t.kvcachedHTTP == "" {
		return t, errors.New("oasis-kvcached registers no oasis_metrics_addr")
	}
	t.kvcachedPass, err = localstack.KvcachedPassword(s)
	return t, err
}

// pidOf finds the running process whose executable is bin (the stack runs
// its jobs' binaries from its own bin directory), 0 when none is. The soak
// looks again at every sample: a restarted task is a new process.
func pidOf(bin string) int {
	want, err := filepath.EvalSymlinks(bin)
	if err != nil {
		want = bin
	}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe"))
		if err == nil && strings.TrimSuffix(exe, " (deleted)") == want {
			return pid
		}
	}
	return 0
}

// rssBytes is a process's resident set size (VmRSS), 0 when it is gone.
func rssBytes(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(string(v)), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
