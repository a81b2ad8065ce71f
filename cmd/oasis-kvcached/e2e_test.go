package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/kvcached/app"
)

// binary is the oasis-kvcached built once for the package's tests.
var binary string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithCommand(m, "github.com/oasis-llm/oasis/cmd/oasis-kvcached", &binary))
}

type proc struct {
	*testutil.Process
	addr     string
	httpAddr string
	quicAddr string
	client   *redis.Client
}

// start runs the binary with extra flags, waits until it answers PING, and
// stops it when the test ends.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	return startEnv(t, nil, args...)
}

// startEnv is start with more environment variables (KEY=value).
func startEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{addr: testutil.FreeAddr(t), httpAddr: testutil.FreeAddr(t)}
	full := append([]string{"--addr", p.addr, "--http-addr", p.httpAddr, "--log-level", "debug"}, args...)
	for i, a := range full {
		if a == "--quic-addr" {
			p.quicAddr = full[i+1]
		}
	}
	cmd := exec.Command(binary, full...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	p.Process = testutil.Start(t, cmd)
	p.client = redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
	t.Cleanup(func() { p.client.Close() })
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if p.Exited() {
			return wait.ErrTimeoutExceeded
		}
		return p.client.Ping(context.Background()).Err()
	}), wait.Timeout(15*time.Second), wait.Gap(50*time.Millisecond)))
	return p
}

func (p *proc) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := p.series(t, name)
	if !ok {
		t.Fatalf("metric %s not found", name)
	}
	return v
}

// series is name's value, and whether p exports it at all.
func (p *proc) series(t *testing.T, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			must.NoError(t, err)
			return v, true
		}
	}
	return 0, false
}

// waitMore waits until p's counter name has grown by n from now: the
// evidence that what it counts (filters served, filter exchanges, discovery
// queries) happened n more times. A series not exported yet counts 0.
func (p *proc) waitMore(t *testing.T, name string, n float64, timeout time.Duration) {
	t.Helper()
	before, _ := p.series(t, name)
	testutil.Eventually(t, timeout, fmt.Sprintf("%s to grow by %v", name, n), func() bool {
		v, _ := p.series(t, name)
		return v >= before+n
	})
}

// filtersServed is the counter of membership filters a node sent its peers.
const filtersServed = `oasis_kvcached_peer_requests_served_total{op="filter",result="ok"}`

// blockValue is the deterministic content of block i.
func blockValue(i int) []byte {
	size := 1024 + (i*7919)%(96<<10)
	pat := []byte(fmt.Sprintf("block-%d|", i))
	return bytes.Repeat(pat, size/len(pat)+1)[:size]
}

func blockKey(i int) string { return fmt.Sprintf("m@1@0@%x@bfloat16kv_bytes", i+1) }

// TestCrashKeepsEveryReturnedBlockIntact writes blocks from several clients,
// SIGKILLs the process mid-write, restarts it on the same data directory and
// checks that every block it returns is byte-exact and that only blocks still
// in flight (at most a RAM tier's worth) were lost.
func TestCrashKeepsEveryReturnedBlockIntact(t *testing.T) {
	dir := t.TempDir()
	const ram = 2 << 20
	args := []string{"--ram-bytes", strconv.Itoa(ram), "--disk-bytes", "1GiB", "--data-dir", dir}
	p := start(t, args...)
	ctx := context.Background()

	var next, acked atomic.Int64
	var ackedMu sync.Mutex
	ackedSet := map[int]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1, PoolSize: 1})
			defer c.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1)) - 1
				if err := c.Set(ctx, blockKey(i), blockValue(i), 0).Err(); err != nil {
					return // the process died under us
				}
				acked.Add(1)
				ackedMu.Lock()
				ackedSet[i] = true
				ackedMu.Unlock()
			}
		}()
	}
	testutil.Eventually(t, 60*time.Second, "400 acknowledged writes", func() bool { return acked.Load() >= 400 })
	must.NoError(t, p.Kill())
	close(stop)
	wg.Wait()
	attempted := int(next.Load())

	p2 := start(t, args...)
	lost, lostBytes, present := 0, 0, 0
	pipe := p2.client.Pipeline()
	cmds := make([]*redis.StringCmd, attempted)
	for i := 0; i < attempted; i++ {
		cmds[i] = pipe.Get(ctx, blockKey(i))
	}
	_, _ = pipe.Exec(ctx)
	for i, c := range cmds {
		v, err := c.Bytes()
		if err == redis.Nil {
			if ackedSet[i] {
				lost++
				lostBytes += len(blockValue(i))
			}
			continue
		}
		must.NoError(t, err)
		must.True(t, bytes.Equal(blockValue(i), v), must.Sprintf("block %d returned with wrong content", i))
		present++
	}
	t.Logf("attempted %d, acknowledged %d, present after restart %d, acknowledged but lost %d (%d bytes), corrupt dropped %.0f",
		attempted, len(ackedSet), present, lost, lostBytes, p2.metric(t, "oasis_kvcached_corrupt_blocks_total"))
	must.Greater(t, 0, present)
	// Acknowledged blocks are lost only while their disk write is still in
	// flight: at most what the RAM tier holds plus one block per writer.
	must.LessEq(t, ram+4*(97<<10), lostBytes)
}

// TestPeersFetchOverQUICWithMutualTLS runs two processes that fetch each
// other's blocks, and a third whose certificate comes from another CA.
func TestPeersFetchOverQUICWithMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "oasis test CA")
	caFile, certA, keyA := ca.WriteFiles(t, dir, "a", "oasis-kvcached")
	_, certB, keyB := ca.WriteFiles(t, dir, "b", "oasis-kvcached")
	rogueDir := t.TempDir()
	rogue := tlsfilestest.NewCA(t, "rogue CA")
	_, certR, keyR := rogue.WriteFiles(t, rogueDir, "r", "oasis-kvcached")

	qa, qb, qr := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	common := []string{"--tls-ca", caFile, "--peer-filter-interval", "200ms", "--peer-timeout", "1s", "--ram-bytes", "64MiB"}
	a := start(t, append([]string{"--quic-addr", qa, "--tls-cert", certA, "--tls-key", keyA, "--peers", qb + "," + qr}, common...)...)
	b := start(t, append([]string{"--quic-addr", qb, "--tls-cert", certB, "--tls-key", keyB, "--peers", qa}, common...)...)
	// The rogue trusts the real CA but its own certificate is not signed by it.
	r := start(t, append([]string{"--quic-addr", qr, "--tls-cert", certR, "--tls-key", keyR, "--peers", qa}, common...)...)

	ctx := context.Background()
	val := bytes.Repeat([]byte("kv"), 512<<10) // 1 MiB
	must.NoError(t, a.client.Set(ctx, blockKey(1), val, 0).Err())
	must.NoError(t, b.client.Set(ctx, blockKey(2), []byte("from b"), 0).Err())

	// Within a couple of filter intervals each sees the other's block.
	testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, "each to see the other's block", func() bool {
		return b.client.Exists(ctx, blockKey(1)).Val() == 1 && a.client.Exists(ctx, blockKey(2)).Val() == 1
	})
	got, err := b.client.Get(ctx, blockKey(1)).Bytes()
	must.NoError(t, err)
	must.True(t, bytes.Equal(val, got))
	must.Eq(t, "from b", a.client.Get(ctx, blockKey(2)).Val())
	must.GreaterEq(t, 1.0, b.metric(t, `oasis_kvcached_hits_total{tier="peer"}`)+b.metric(t, `oasis_kvcached_peer_fetches_total{result="hit"}`))
	must.Eq(t, 1.0, b.metric(t, "oasis_kvcached_peers_healthy"))

	// The rogue never gets a block, and a never counts it healthy: three
	// exchanges each way failed meanwhile.
	a.waitMore(t, `oasis_kvcached_peer_filter_exchanges_total{result="error"}`, 3, 10*time.Second)
	r.waitMore(t, `oasis_kvcached_peer_filter_exchanges_total{result="error"}`, 3, 10*time.Second)
	must.Eq(t, int64(0), r.client.Exists(ctx, blockKey(1)).Val())
	must.ErrorIs(t, r.client.Get(ctx, blockKey(1)).Err(), redis.Nil)
	must.Eq(t, 0.0, r.metric(t, "oasis_kvcached_peers_healthy"))
	must.Eq(t, 1.0, a.metric(t, "oasis_kvcached_peers_healthy")) // b only
}

// TestFullDiskDegradesToRAMOnly gives the disk tier a 4 MiB tmpfs while
// allowing it 64 MiB: writes fail with ENOSPC, the store carries on from RAM
// and says so in a metric and /health.
func TestFullDiskDegradesToRAMOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipUnlessCI(t, "mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		testutil.SkipUnlessCI(t, fmt.Sprintf("cannot mount tmpfs: %v %s", err, out))
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	p := start(t, "--ram-bytes", "64MiB", "--disk-bytes", "64MiB", "--data-dir", dir)
	ctx := context.Background()
	for i := 0; i < 12; i++ {
		must.NoError(t, p.client.Set(ctx, blockKey(i), bytes.Repeat([]byte{byte(i)}, 1<<20), 0).Err())
	}
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the disk tier to report degraded", func() bool {
		return p.metric(t, "oasis_kvcached_disk_degraded") == 1
	})
	for i := 0; i < 12; i++ {
		v, err := p.client.Get(ctx, blockKey(i)).Bytes()
		must.NoError(t, err)
		must.True(t, bytes.Equal(bytes.Repeat([]byte{byte(i)}, 1<<20), v))
	}
	resp, err := http.Get("http://" + p.httpAddr + "/health")
	must.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.StrContains(t, string(body), `"disk_degraded":true`)
	must.Greater(t, 0.0, p.metric(t, "oasis_kvcached_spill_errors_total"))
	must.NoError(t, p.client.Ping(ctx).Err())
}

// TestRSSStaysWithinRAMLimit writes twice a 256 MiB budget's worth of 1 MiB
// blocks, with and without a disk tier, and checks the process's peak RSS
// stays within --ram-bytes + 10% and that the RAM tier filled up to what
// the memory plan gives it.
func TestRSSStaysWithinRAMLimit(t *testing.T) {
	const ram = 256 << 20
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("disk=%t", disk), func(t *testing.T) {
			args := []string{"--ram-bytes", strconv.Itoa(ram)}
			if disk {
				args = append(args, "--disk-bytes", "1GiB", "--data-dir", t.TempDir())
			}
			p := start(t, args...)
			ctx := context.Background()
			val := bytes.Repeat([]byte{1}, 1<<20)
			pipe := p.client.Pipeline()
			for i := 0; i < 2*ram>>20; i++ {
				pipe.Set(ctx, blockKey(i), val, 0)
				if i%16 == 15 {
					_, err := pipe.Exec(ctx)
					must.NoError(t, err)
				}
			}
			_, err := pipe.Exec(ctx)
			must.NoError(t, err)
			hwm := peakRSS(t, p.Pid())
			t.Logf("peak RSS %d MiB for --ram-bytes %d MiB", hwm>>20, ram>>20)
			plan, err := app.PlanMemory(ram, 64<<20, disk)
			must.NoError(t, err)
			must.Between(t, float64(plan.Tier-(1<<20)), p.metric(t, `oasis_kvcached_bytes{tier="ram"}`), float64(plan.Tier))
			must.LessEq(t, int64(ram)*11/10, hwm)
		})
	}
}

// peakRSS reads a process's VmHWM in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	must.NoError(t, err)
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			must.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/pid/status")
	return 0
}

// TestOneCommandCannotExceedTheInflightBudget sends one MSET of 16 values of
// 64 MiB over a raw socket to a 256 MiB budget: the command is refused once
// its arguments would hold more than the in-flight budget, the rest of it is
// skipped, the connection keeps working, and RSS stays within the budget.
func TestOneCommandCannotExceedTheInflightBudget(t *testing.T) {
	const ram = 256 << 20
	p := start(t, "--ram-bytes", strconv.Itoa(ram))
	c, err := net.Dial("tcp", p.addr)
	must.NoError(t, err)
	defer c.Close()
	const n, size = 16, 64 << 20
	val := bytes.Repeat([]byte{7}, size)
	go func() {
		w := bufio.NewWriterSize(c, 1<<20)
		fmt.Fprintf(w, "*%d\r\n$4\r\nMSET\r\n", 1+2*n)
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "$%d\r\n%s\r\n$%d\r\n", len(blockKey(i)), blockKey(i), size)
			w.Write(val)
			w.WriteString("\r\n")
		}
		w.WriteString("*1\r\n$4\r\nPING\r\n")
		w.Flush()
	}()
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	must.NoError(t, err)
	must.StrContains(t, line, "in-flight memory limit")
	line, err = br.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, "+PONG\r\n", line)
	hwm := peakRSS(t, p.Pid())
	t.Logf("peak RSS %d MiB for --ram-bytes %d MiB", hwm>>20, ram>>20)
	must.LessEq(t, int64(ram)*11/10, hwm)
}

// TestIdleAndAuthTimeoutFlags: the binary closes a connection that stays
// idle past --idle-timeout, and with a password one that does not
// authenticate within --auth-timeout.
func TestIdleAndAuthTimeoutFlags(t *testing.T) {
	closedWithin := func(t *testing.T, addr string, d time.Duration) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		must.NoError(t, err)
		defer c.Close()
		begin := time.Now()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadAll(c)
		must.NoError(t, err) // EOF: the server closed it
		must.Less(t, d, time.Since(begin))
	}
	p := start(t, "--ram-bytes", "64MiB", "--idle-timeout", "300ms")
	closedWithin(t, p.addr, 5*time.Second)

	pw := filepath.Join(t.TempDir(), "password")
	must.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	addr, httpAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	testutil.Start(t, exec.Command(binary, "--addr", addr, "--http-addr", httpAddr, "--ram-bytes", "64MiB",
		"--password-file", pw, "--auth-timeout", "300ms"))
	client := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret"})
	defer client.Close()
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error { return client.Ping(context.Background()).Err() }),
		wait.Timeout(15*time.Second), wait.Gap(50*time.Millisecond)))
	closedWithin(t, addr, 5*time.Second)
}

// TestPasswordFileReloadsOnSIGHUP: the Nomad job's template rewrites the
// password file and sends SIGHUP; the new password then authenticates, the
// old one no longer does, and a connection that authenticated before stays
// usable. An empty file (a template whose variable lacks the item) is
// refused at start, and on reload keeps the current password.
func TestPasswordFileReloadsOnSIGHUP(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	must.NoError(t, os.WriteFile(pw, nil, 0o600))
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(tctx, binary, "--addr", testutil.FreeAddr(t), "--http-addr", "", "--ram-bytes", "64MiB", "--password-file", pw).CombinedOutput()
	must.Error(t, err)
	must.StrContains(t, string(out), "is empty")

	must.NoError(t, os.WriteFile(pw, []byte("old\n"), 0o600))
	addr := testutil.FreeAddr(t)
	p := testutil.Start(t, exec.Command(binary, "--addr", addr, "--http-addr", "", "--ram-bytes", "64MiB", "--password-file", pw))
	old := redis.NewClient(&redis.Options{Addr: addr, Password: "old", PoolSize: 1})
	defer old.Close()
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error { return old.Set(ctx, "k", "v", 0).Err() }),
		wait.Timeout(15*time.Second), wait.Gap(50*time.Millisecond)))

	must.NoError(t, os.WriteFile(pw, []byte("new\n"), 0o600))
	must.NoError(t, syscall.Kill(p.Pid(), syscall.SIGHUP))
	fresh := func(pass string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, Password: pass, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error { return fresh("new").Ping(ctx).Err() }),
		wait.Timeout(5*time.Second), wait.Gap(20*time.Millisecond)))
	must.ErrorContains(t, fresh("old").Ping(ctx).Err(), "WRONGPASS")
	must.Eq(t, "v", old.Get(ctx, "k").Val())

	must.NoError(t, os.WriteFile(pw, nil, 0o600))
	must.NoError(t, syscall.Kill(p.Pid(), syscall.SIGHUP))
	testutil.Eventually(t, 5*time.Second, "the empty file refused", func() bool {
		return strings.Contains(p.Output(), "keeping the current password")
	})
	must.False(t, p.Exited())
	must.NoError(t, fresh("new").Ping(ctx).Err())
	must.ErrorContains(t, fresh("").Get(ctx, "k").Err(), "NOAUTH")
}
