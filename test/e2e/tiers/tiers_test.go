// Package tiers_test runs engines against a password-protected oasis-kvcached through a KV
// offload tier declared in Nomad variables, on the test bed (real Consul and Nomad with ACLs on,
// the llm driver, jobs/kvcached.nomad.hcl, jobs/acl/nomad-oasis-tiers.hcl): the driver reads the
// tier and the password with each task's workload identity, and the LMCache configuration it
// writes authenticates to kvcached; the identity reads kvcached's password and not its TLS key; a
// shared-fs tier starts a vLLM-protocol engine with llm-d's SharedStorageOffloadingSpec.
package tiers_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testbed.Main(m, testbed.Options{}, &stack))
}

const tierName = "e2e-kv"

// TestEnginesUseAPasswordProtectedKvcachedThroughATier: two sim engines name the tier; each
// gets an LMCache configuration whose remote_url carries kvcached's password, in its secrets
// directory and readable by the engine's account alone; kvcached accepts that URL and refuses a
// client without the password. A changed declaration reaches a new allocation, not the running
// ones, and a job whose identity may not read the tier fails naming kv_offload_tier.
func TestEnginesUseAPasswordProtectedKvcachedThroughATier(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	password := randomPassword(t)
	kvAddr := runKvcached(t, ctx, password)
	declareTier(t, map[string]string{"kind": "kvcached", "address": kvAddr, "size_gb": "1",
		"secret_path": passwordVariable, "secret_item": "redis_password"})

	const jobID = "tier-sims"
	allowTiers(t, jobID)
	allocs := runEngines(t, ctx, jobID, 2)

	for _, a := range allocs {
		url := checkLMCacheConfig(t, a.ID, password, "max_local_cpu_size: 1\n")
		opts, err := redis.ParseURL(url)
		must.NoError(t, err)
		must.EqOp(t, password, opts.Password)
		rdb := redis.NewClient(opts)
		must.NoError(t, rdb.Set(ctx, "tier-e2e-"+a.ID, "v", 0).Err())
		must.EqOp(t, "v", rdb.Get(ctx, "tier-e2e-"+a.ID).Val())
		must.NoError(t, rdb.Close())
		checkStartEventHidesPassword(t, ctx, a.ID, password)
	}
	checkIdentityReadsPasswordAlone(t, ctx, allocs[0].ID, password)
	open := redis.NewClient(&redis.Options{Addr: kvAddr})
	defer open.Close()
	err := open.Set(ctx, "tier-e2e-open", "v", 0).Err()
	must.ErrorContains(t, err, "NOAUTH", must.Sprint("kvcached must refuse a client without the password"))

	// A changed declaration: running engines keep theirs, a new allocation gets the new one.
	declareTier(t, map[string]string{"kind": "kvcached", "address": kvAddr, "size_gb": "2",
		"secret_path": passwordVariable, "secret_item": "redis_password"})
	_, err = stack.Nomad.Allocations().Stop(&nomadapi.Allocation{ID: allocs[0].ID}, nil)
	must.NoError(t, err)
	var fresh string
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		running, err := stack.WaitAllocsRunning(ctx, jobID)
		if err != nil {
			return err
		}
		for _, a := range running {
			if a.ID != allocs[0].ID && a.ID != allocs[1].ID {
				fresh = a.ID
				return nil
			}
		}
		return errors.New("no replacement allocation running yet")
	}), wait.Timeout(2*time.Minute), wait.Gap(500*time.Millisecond)))
	checkLMCacheConfig(t, fresh, password, "max_local_cpu_size: 2\n")
	checkLMCacheConfig(t, allocs[1].ID, password, "max_local_cpu_size: 1\n")

	// Without the policy the task's identity may not read the tier (Nomad answers as if it did
	// not exist): the start fails, naming the field.
	const deniedID = "tier-sims-denied"
	failed := startEnginesExpectingFailure(t, ctx, deniedID)
	must.StrContains(t, failed, `kv_offload_tier: tier "`+tierName+`": tier is not declared: no Nomad variable oasis/tiers/`+tierName+` that this token may read`)
}

// TestSimEngineUsesASharedFSTier: a vLLM-protocol engine naming a shared-fs tier starts with
// vLLM's OffloadingConnector and llm-d's SharedStorageOffloadingSpec on the declared directory,
// read with the task's identity (the argv of the driver's start event).
func TestSimEngineUsesASharedFSTier(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "e2e-nfs"
	dir := t.TempDir()
	_, _, err := stack.Nomad.Variables().Update(&nomadapi.Variable{Path: "oasis/tiers/" + name,
		Items: nomadapi.VariableItems{"kind": "shared-fs", "path": dir, "size_gb": "1"}}, nil)
	must.NoError(t, err)
	t.Cleanup(func() { _, _ = stack.Nomad.Variables().Delete("oasis/tiers/"+name, nil) })

	const jobID = "tier-sim-nfs"
	allowTiers(t, jobID)
	t.Cleanup(func() { stopJob(t, jobID) })
	_, err = stack.RunJobHCL(ctx, strings.Replace(engineJob(jobID, 1), `"`+tierName+`"`, `"`+name+`"`, 1))
	must.NoError(t, err)
	allocs, err := stack.WaitAllocsRunning(ctx, jobID)
	must.NoError(t, err)
	must.Len(t, 1, allocs)

	started := startEvent(t, ctx, allocs[0].ID)
	must.StrContains(t, started, `"kv_connector":"OffloadingConnector"`)
	must.StrContains(t, started, `"spec_name":"SharedStorageOffloadingSpec"`)
	must.StrContains(t, started, `"shared_storage_path":"`+dir+`"`)
	must.StrContains(t, started, `"max_staging_memory_gb":1`)
}

// startEvent returns the message of the driver's "Starting ... engine" task event (its argv).
func startEvent(t *testing.T, ctx context.Context, allocID string) string {
	t.Helper()
	a, _, err := stack.Nomad.Allocations().Info(allocID, (&nomadapi.QueryOptions{}).WithContext(ctx))
	must.NoError(t, err)
	for _, ts := range a.TaskStates {
		for _, ev := range ts.Events {
			if strings.HasPrefix(ev.DisplayMessage, "Starting ") {
				return ev.DisplayMessage
			}
		}
	}
	t.Fatalf("allocation %s has no Starting event", allocID)
	return ""
}

func randomPassword(t *testing.T) string {
	b := make([]byte, 12)
	_, err := rand.Read(b)
	must.NoError(t, err)
	return "p@ss:" + hex.EncodeToString(b) + "/%" // characters the URL must escape
}

// Where jobs/kvcached.nomad.hcl reads its secrets: the password in its task group's variable,
// which engines may read (jobs/acl/nomad-oasis-tiers.hcl); the peers' TLS material and Consul
// token in the job's variable, which they may not.
const (
	passwordVariable = "nomad/jobs/oasis-kvcached/kvcached"
	jobVariable      = "nomad/jobs/oasis-kvcached"
	tlsKey           = "-----BEGIN PRIVATE KEY-----e2e-----END PRIVATE KEY-----"
)

// runKvcached runs jobs/kvcached.nomad.hcl with auth_enabled and its password in the task
// group's variable (and a TLS key item in the job's variable, as a cluster with peers has), and
// returns its Redis-protocol address.
func runKvcached(t *testing.T, ctx context.Context, password string) string {
	t.Helper()
	for path, items := range map[string]nomadapi.VariableItems{
		passwordVariable: {"redis_password": password},
		jobVariable:      {"key": tlsKey},
	} {
		_, _, err := stack.Nomad.Variables().Create(&nomadapi.Variable{Path: path, Items: items}, nil)
		must.NoError(t, err)
		t.Cleanup(func() { _, _ = stack.Nomad.Variables().Delete(path, nil) })
	}
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	ports, err := testutil.FreePorts(3)
	must.NoError(t, err)
	vars := map[string]string{
		"oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr,
		"resp_port": strconv.Itoa(ports[0]), "http_port": strconv.Itoa(ports[1]), "quic_port": strconv.Itoa(ports[2]),
		"kv_events_address": "127.0.0.1", "data_dir": filepath.Join(t.TempDir(), "kvcached"),
		"ram_bytes": "64MiB", "disk_bytes": "0", "memory_mb": "256", "auth_enabled": "true",
	}
	t.Cleanup(func() { stopJob(t, "oasis-kvcached") })
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "kvcached.nomad.hcl"), vars))
	return "127.0.0.1:" + strconv.Itoa(ports[0])
}

// declareTier writes the tier's declaration, as the platform team does with `nomad var put`.
func declareTier(t *testing.T, items map[string]string) {
	t.Helper()
	_, _, err := stack.Nomad.Variables().Update(&nomadapi.Variable{Path: "oasis/tiers/" + tierName, Items: items}, nil)
	must.NoError(t, err)
	t.Cleanup(func() { _, _ = stack.Nomad.Variables().Delete("oasis/tiers/"+tierName, nil) })
}

// allowTiers attaches jobs/acl/nomad-oasis-tiers.hcl to the job, as jobs/acl/setup.sh does for
// OASIS_TIER_JOBS.
func allowTiers(t *testing.T, jobID string) {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	rules, err := os.ReadFile(filepath.Join(root, "jobs", "acl", "nomad-oasis-tiers.hcl"))
	must.NoError(t, err)
	name := "oasis-tiers-" + jobID
	_, err = stack.Nomad.ACLPolicies().Upsert(&nomadapi.ACLPolicy{Name: name, Rules: string(rules),
		JobACL: &nomadapi.JobACL{Namespace: "default", JobID: jobID}}, nil)
	must.NoError(t, err)
	t.Cleanup(func() { _, _ = stack.Nomad.ACLPolicies().Delete(name, nil) })
}

// engineJob is count sim engines naming the tier. A sim with a KV connector listens on vLLM's
// NIXL side channel (default port 5600): each engine gets a port of its own for it.
func engineJob(jobID string, count int) string {
	hcl := testbed.SimEngine{ID: jobID, Model: jobID,
		Config: `kv_offload_tier = "` + tierName + `"
        extra_env = { VLLM_NIXL_SIDE_CHANNEL_PORT = "${NOMAD_PORT_side}" }`,
		Task: "identity {\n        file = true\n      }"}.HCL()
	hcl = strings.Replace(hcl, `port "http" {}`, `port "http" {}
      port "side" {}`, 1)
	return strings.Replace(hcl, `group "engine" {`, `group "engine" {
    count = `+strconv.Itoa(count), 1)
}

func runEngines(t *testing.T, ctx context.Context, jobID string, count int) []*nomadapi.AllocationListStub {
	t.Helper()
	t.Cleanup(func() { stopJob(t, jobID) })
	_, err := stack.RunJobHCL(ctx, engineJob(jobID, count))
	must.NoError(t, err)
	allocs, err := stack.WaitAllocsRunning(ctx, jobID)
	must.NoError(t, err)
	must.Len(t, count, allocs)
	return allocs
}

// startEnginesExpectingFailure registers the engine job and returns its task's Driver Failure
// message.
func startEnginesExpectingFailure(t *testing.T, ctx context.Context, jobID string) string {
	t.Helper()
	t.Cleanup(func() { stopJob(t, jobID) })
	job, err := stack.ParseJobHCL(engineJob(jobID, 1))
	must.NoError(t, err)
	_, _, err = stack.Nomad.Jobs().Register(job, nil)
	must.NoError(t, err)
	var msg string
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		allocs, _, err := stack.Nomad.Jobs().Allocations(jobID, false, nil)
		if err != nil {
			return err
		}
		for _, a := range allocs {
			for _, ts := range a.TaskStates {
				for _, ev := range ts.Events {
					if ev.Type == nomadapi.TaskDriverFailure {
						msg = ev.DisplayMessage + " " + ev.DriverError
						return nil
					}
				}
			}
		}
		return errors.New("no Driver Failure event yet")
	}), wait.Timeout(2*time.Minute), wait.Gap(500*time.Millisecond)))
	_ = ctx
	return msg
}

var remoteURL = regexp.MustCompile(`(?m)^remote_url: "([^"]+)"$`)

// checkLMCacheConfig checks the LMCache configuration the driver wrote for an allocation: in the
// task's secrets directory, 0600 and owned by the engine's account (nobody), the password in its
// URL, and want in it; it returns the URL.
func checkLMCacheConfig(t *testing.T, allocID, password, want string) string {
	t.Helper()
	path := filepath.Join(stack.AllocDir(allocID), "engine", "secrets", "lmcache.yaml")
	fi, err := os.Stat(path)
	must.NoError(t, err)
	must.EqOp(t, os.FileMode(0o600), fi.Mode().Perm())
	if os.Geteuid() == 0 {
		must.EqOp(t, uint32(65534), fi.Sys().(*syscall.Stat_t).Uid, must.Sprint("owned by the engine's account, nobody"))
	}
	b, err := os.ReadFile(path)
	must.NoError(t, err)
	must.StrContains(t, string(b), want)
	m := remoteURL.FindStringSubmatch(string(b))
	must.Len(t, 2, m, must.Sprintf("no remote_url in %s", b))
	opts, err := redis.ParseURL(m[1])
	must.NoError(t, err)
	must.EqOp(t, password, opts.Password)
	return m[1]
}

// checkIdentityReadsPasswordAlone: with the tier policy an engine task's workload identity (its
// secrets/nomad_token, what the driver reads the tier with) reads the variable holding kvcached's
// password and neither reads nor lists kvcached's job variable with the TLS key, through Nomad's
// HTTP API with ACLs on.
func checkIdentityReadsPasswordAlone(t *testing.T, ctx context.Context, allocID, password string) {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(stack.AllocDir(allocID), "engine", "secrets", "nomad_token"))
	must.NoError(t, err)
	cfg := nomadapi.DefaultConfig()
	cfg.Address, cfg.SecretID = stack.NomadAddr, strings.TrimSpace(string(tok))
	engine, err := nomadapi.NewClient(cfg)
	must.NoError(t, err)
	q := (&nomadapi.QueryOptions{}).WithContext(ctx)

	v, _, err := engine.Variables().Read(passwordVariable, q)
	must.NoError(t, err)
	must.EqOp(t, password, v.Items["redis_password"])

	// The operator's token reads the key: the item exists, the engine may not read it.
	v, _, err = stack.Nomad.Variables().Read(jobVariable, q)
	must.NoError(t, err)
	must.EqOp(t, tlsKey, v.Items["key"])
	v, _, err = engine.Variables().Read(jobVariable, q)
	must.Error(t, err, must.Sprint("an engine's identity must not read kvcached's job variable"))
	must.Nil(t, v)

	listed, _, err := engine.Variables().PrefixList("nomad/jobs/oasis-kvcached", q)
	must.NoError(t, err)
	for _, m := range listed {
		must.NotEq(t, jobVariable, m.Path, must.Sprint("an engine's identity must not list kvcached's job variable"))
	}
}

// checkStartEventHidesPassword: the password is in no task event (the argv the driver reports).
func checkStartEventHidesPassword(t *testing.T, ctx context.Context, allocID, password string) {
	t.Helper()
	a, _, err := stack.Nomad.Allocations().Info(allocID, (&nomadapi.QueryOptions{}).WithContext(ctx))
	must.NoError(t, err)
	for _, ts := range a.TaskStates {
		for _, ev := range ts.Events {
			must.StrNotContains(t, ev.DisplayMessage, password)
			for _, v := range ev.Details {
				must.StrNotContains(t, v, password)
			}
		}
	}
}

func stopJob(t *testing.T, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := stack.StopJob(ctx, id); err != nil {
		t.Errorf("stopping %s: %v", id, err)
	}
}

// TestValidateReadsTiers: `nomad-driver-llm validate` reads the tier a task names from Nomad
// variables with the operator's token and renders it (the secret stays a reference); an
// undeclared tier, a bad declaration and a task that does not expose its identity fail naming
// kv_offload_tier.
func TestValidateReadsTiers(t *testing.T) {
	declareTier(t, map[string]string{"kind": "kvcached", "address": "${node.ip}:6380",
		"secret_path": passwordVariable, "secret_item": "redis_password"})
	_, _, err := stack.Nomad.Variables().Update(&nomadapi.Variable{Path: "oasis/tiers/bad",
		Items: nomadapi.VariableItems{"kind": "kvcached", "address": "127.0.0.1:6380"}}, nil)
	must.NoError(t, err)
	t.Cleanup(func() { _, _ = stack.Nomad.Variables().Delete("oasis/tiers/bad", nil) })

	withoutIdentity := strings.Replace(engineJob("v", 1), "identity {\n        file = true\n      }", "", 1)
	cases := []struct {
		name, hcl string
		code      int
		want      string
	}{
		{"declared", engineJob("v", 1), 0, `ok: `},
		{"undeclared", strings.Replace(engineJob("v", 1), `"`+tierName+`"`, `"missing"`, 1), 1,
			`kv_offload_tier: tier "missing": tier is not declared`},
		{"bad declaration", strings.Replace(engineJob("v", 1), `"`+tierName+`"`, `"bad"`, 1), 1,
			`kv_offload_tier: tier "bad" (Nomad variable oasis/tiers/bad) item secret_path: a kvcached tier needs its password by reference`},
		{"identity not exposed", withoutIdentity, 1, "kv_offload_tier: the driver reads the tier at start with the task's workload identity"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			jobFile := filepath.Join(t.TempDir(), "job.nomad.hcl")
			must.NoError(t, os.WriteFile(jobFile, []byte(tc.hcl), 0o644))
			cmd := exec.Command(stack.Bin("nomad-driver-llm"), "validate", "-address", stack.NomadAddr, jobFile)
			cmd.Env = stack.Env() // NOMAD_TOKEN, as an operator's shell has it
			out, err := cmd.CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else {
				must.NoError(t, err)
			}
			must.EqOp(t, tc.code, code, must.Sprint(string(out)))
			must.StrContains(t, string(out), tc.want)
			if tc.code == 0 {
				// The declaration is rendered; the password is not read (a reference stands in).
				must.StrContains(t, string(out), "--kv-transfer-config")
			}
		})
	}
}
