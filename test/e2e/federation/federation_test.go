// Package federation tests the two-datacenter test bed: Consul WAN federation and Nomad regions
// with ACLs replicated from the primary, and workload identity in the secondary.
package federation

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var fed *testbed.Federation

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	start := time.Now()
	f, err := testbed.StartFederation(ctx, testbed.FederationOptions{Options: testbed.Options{Logf: logf}})
	cancel()
	if err != nil {
		logf("federation: starting two datacenters: %v", err)
		return 1
	}
	logf("federation: two datacenters ready in %s", time.Since(start).Round(100*time.Millisecond))
	fed = f
	code := m.Run()
	if code != 0 {
		for _, s := range f.DCs {
			logf("federation: %s nomad log tail:\n%s", s.Datacenter, s.NomadLog())
		}
	}
	if err := f.Close(); err != nil {
		logf("federation: teardown: %v", err)
		code = 1
	}
	return code
}

// TestFederated checks what StartFederation promises: both Consul servers alive in the WAN
// pool, both regions listed, and the primary's management tokens accepted in the secondary.
func TestFederated(t *testing.T) {
	dc1, dc2 := fed.DC("dc1"), fed.DC("dc2")
	members, err := dc1.Consul.Agent().Members(true)
	must.NoError(t, err)
	var alive []string
	for _, m := range members {
		if m.Status == 1 {
			alive = append(alive, m.Name)
		}
	}
	must.SliceContainsAll(t, []string{"oasis-testbed-dc1.dc1", "oasis-testbed-dc2.dc2"}, alive)

	regions, err := dc2.Nomad.Regions().List()
	must.NoError(t, err)
	must.SliceContainsAll(t, []string{"dc1", "dc2"}, regions)

	if dc1.ConsulToken == "" {
		t.Skip("ACLs off")
	}
	must.Eq(t, dc1.ConsulToken, dc2.ConsulToken)
	self, _, err := dc2.Consul.ACL().TokenReadSelf(nil)
	must.NoError(t, err)
	must.Eq(t, "00000000-0000-0000-0000-000000000001", self.Policies[0].ID, must.Sprint("dc2 does not see the management token"))
	nself, _, err := dc2.Nomad.ACLTokens().Self(nil)
	must.NoError(t, err)
	must.Eq(t, "management", nself.Type)
	must.True(t, nself.Global)
}

// TestIdleFootprint measures the resident memory of every process of the two-datacenter stack
// before any job runs (the agents and their plugins): both datacenters' Consul and Nomad are
// there, and the whole stays under 1 GiB, twice what it takes, so a leak or a stray agent shows.
// It measures once the stack is idle: both Nomad clients ready and the total resident memory
// within 2% across two reads a second apart.
func TestIdleFootprint(t *testing.T) {
	var fp, prev footprint
	testutil.EventuallyEvery(t, 60*time.Second, time.Second, "both Nomad clients ready and a steady resident total", func() bool {
		prev, fp = fp, readFootprint(t)
		return nomadClientReady(fed.DC("dc1")) && nomadClientReady(fed.DC("dc2")) &&
			prev.kib > 0 && fp.kib*100 <= prev.kib*102 && prev.kib*100 <= fp.kib*102
	})
	must.Eq(t, 2, fp.byCount["consul"], must.Sprintf("consul agents: %v", fp.byName))
	must.Eq(t, 2, fp.byCount["nomad"], must.Sprintf("nomad agents: %v", fp.byName))
	must.Less(t, 1024, fp.kib/1024, must.Sprintf("the idle stack takes %d MiB: %v", fp.kib/1024, fp.byName))
	t.Logf("idle two-datacenter stack: %d processes, %d MiB resident (MiB by binary: %v; previous read %d MiB)",
		fp.n, fp.kib/1024, fp.byName, prev.kib/1024)
}

// footprint is the resident memory of the stack's processes at one read.
type footprint struct {
	kib, n  int
	byName  map[string]int // MiB by binary name
	byCount map[string]int // agents by binary name
}

// readFootprint sums VmRSS over every process whose command line names the stack's directory.
func readFootprint(t *testing.T) footprint {
	t.Helper()
	fp := footprint{byName: map[string]int{}, byCount: map[string]int{}}
	entries, err := os.ReadDir("/proc")
	must.NoError(t, err)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), fed.Dir+"/") {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				k, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				fp.kib += k
				fp.n++
				args := strings.Split(string(cmdline), "\x00")
				name := filepath.Base(args[0])
				fp.byName[name] += k / 1024
				if len(args) > 1 && args[1] == "agent" {
					fp.byCount[name]++
				}
			}
		}
	}
	return fp
}

// nomadClientReady says whether the datacenter's Nomad lists a ready client node.
func nomadClientReady(s *testbed.Stack) bool {
	nodes, _, err := s.Nomad.Nodes().List(nil)
	if err != nil {
		return false
	}
	for _, n := range nodes {
		if n.Status == nomadapi.NodeStatusReady {
			return true
		}
	}
	return false
}

// TestEngineInSecondRegion runs a sim engine job in region dc2, submitted to dc1's Nomad (which
// forwards it), and finds it passing in dc2's Consul through dc1's Consul (`?dc=dc2`): the
// service registered with a token from dc2's own auth method.
func TestEngineInSecondRegion(t *testing.T) {
	dc1, dc2 := fed.DC("dc1"), fed.DC("dc2")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	job, err := dc1.ParseJobHCL(testbed.SimEngine{ID: "fed-sim", Model: "fed"}.HCL())
	must.NoError(t, err)
	job.Region = &dc2.Region
	_, _, err = dc1.Nomad.Jobs().Register(job, nil)
	must.NoError(t, err)
	defer func() { must.NoError(t, dc2.StopJob(context.Background(), "fed-sim")) }()
	_, err = dc2.WaitAllocsRunning(ctx, "fed-sim")
	must.NoError(t, err)

	q := &consulapi.QueryOptions{Datacenter: "dc2"}
	var entries []*consulapi.ServiceEntry
	testutil.EventuallyEvery(t, 2*time.Minute, 200*time.Millisecond, "the engine passing in dc2, seen through dc1's Consul", func() bool {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second) // cross-DC calls need their own timeout
		defer ccancel()
		entries, _, err = dc1.Consul.Health().Service("oasis-engine", "", true, q.WithContext(cctx))
		return err == nil && len(entries) == 1
	})
	must.Len(t, 1, entries)
	must.Eq(t, "fed", entries[0].Service.Meta["oasis_model"])
	must.Eq(t, "dc2", entries[0].Node.Datacenter)
	local, _, err := dc1.Consul.Health().Service("oasis-engine", "", false, nil)
	must.NoError(t, err)
	must.Len(t, 0, local, must.Sprint("dc2's engine registered in dc1's Consul"))
}

// TestRouterInSecondRegion runs jobs/router.nomad.hcl in region dc2: its task's consul block
// logs in with dc2's auth method (the binding rule jobs/acl/setup.sh made there) and the
// router's service passes in dc2's Consul.
func TestRouterInSecondRegion(t *testing.T) {
	dc2 := fed.DC("dc2")
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	err = dc2.RunJobFile(ctx, filepath.Join(root, "jobs", "router.nomad.hcl"), map[string]string{
		"region": dc2.Region, "oasis_bin_dir": dc2.BinDir, "consul_addr": dc2.ConsulAddr,
		"nomad_addr": dc2.NomadAddr, "http_port": strconv.Itoa(ports[0]),
	})
	must.NoError(t, err)
	defer func() { must.NoError(t, dc2.StopJob(context.Background(), "oasis-router")) }()
	routers, err := dc2.WaitServicePassing(ctx, "oasis-router", 1)
	must.NoError(t, err)
	must.Eq(t, ports[0], routers[0].Service.Port)
	if dc2.ConsulToken == "" {
		return
	}
	// The task's token: made by dc2's own auth method, local to dc2, holding the job's role.
	tokens, _, err := dc2.Consul.ACL().TokenListFiltered(consulapi.ACLTokenFilterOptions{AuthMethod: testbed.AuthMethod}, nil)
	must.NoError(t, err)
	var roles []string
	for _, tok := range tokens {
		must.True(t, tok.Local, must.Sprint("a login token of dc2's auth method is not local"))
		for _, r := range tok.Roles {
			roles = append(roles, r.Name)
		}
	}
	must.SliceContains(t, roles, "oasis-router")
}

// TestFreezeSecondDC freezes dc2's Consul: a `?dc=dc2` query from dc1 then hangs until its own
// timeout, and answers again once dc2 is thawed.
func TestFreezeSecondDC(t *testing.T) {
	dc1, dc2 := fed.DC("dc1"), fed.DC("dc2")
	query := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, _, err := dc1.Consul.Catalog().Services((&consulapi.QueryOptions{Datacenter: "dc2"}).WithContext(ctx))
		return err
	}
	must.NoError(t, query(5*time.Second))
	must.NoError(t, dc2.Freeze(testbed.AgentConsul))
	thawed := false
	defer func() {
		if !thawed {
			must.NoError(t, dc2.Thaw(testbed.AgentConsul))
		}
	}()
	start := time.Now()
	err := query(2 * time.Second)
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.Greater(t, 1900*time.Millisecond, time.Since(start))
	must.NoError(t, dc2.Thaw(testbed.AgentConsul))
	thawed = true
	// ErrorFunc: a failure shows the last query's error.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if err := query(5 * time.Second); err != nil {
			return fmt.Errorf("dc2 never answered again after thawing: %w", err)
		}
		return nil
	}), wait.Timeout(30*time.Second), wait.Gap(200*time.Millisecond)))
}
