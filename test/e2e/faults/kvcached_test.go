package faults

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// TestKvcachedKilledUnderLMCacheLoad runs jobs/kvcached.nomad.hcl on the test bed (a RAM tier over
// an SSD tier in a temporary directory), drives it the way LMCache's Redis connector does (writers
// SET K+"kv_bytes" then K+"metadata"; readers EXISTS K+"metadata", GET both, DEL the metadata when
// the bytes are gone), SIGKILLs the kvcached process while that load runs, and keeps the load going
// while Nomad's restart block brings it back.
//
// What is lost, and the bounds it asserts:
//   - Requests: the commands sent while no kvcached listens fail with connection errors (writes
//     are then not acknowledged, lookups not answered). No command fails before the kill, nor
//     later than errorGrace after the restarted process first answers.
//   - Blocks: only chunks acknowledged just before the kill, whose kv_bytes or metadata the store
//     had not yet handed to the kernel (kvcached/README.md, "What kill -9 loses"): their kv_bytes
//     together are at most the RAM tier, none was acknowledged more than lossWindow before the
//     kill, and every chunk acknowledged after the restart is intact.
//   - Corruption: none. Every GET that returns data verifies (key, length, checksum), a chunk's
//     metadata always describes the kv_bytes served with it, EXISTS never finds a chunk that was
//     never written, and kvcached itself drops no corrupt block.
func TestKvcachedKilledUnderLMCacheLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kv := runKvcached(t, ctx)

	load := newLMCacheLoad(kv.addr)
	defer load.rdb.Close()
	ctl := redis.NewClient(kvcachedClientOptions(kv.addr))
	defer ctl.Close()
	ramLimit := infoInt(t, ctx, ctl, "kvcached", "ram_limit_bytes")

	stop := make(chan struct{})
	var workers sync.WaitGroup
	for w := range lmcacheWriters {
		workers.Go(func() { load.write(ctx, stop, w) })
	}
	for r := range lmcacheReaders {
		workers.Go(func() { load.read(ctx, stop, r) })
	}
	stopLoad := sync.OnceFunc(func() { close(stop); workers.Wait() })
	defer stopLoad()

	// Enough chunks that most of them live only on disk (the RAM tier holds a few dozen), so the
	// restarted process serves blocks it must have kept there.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return load.ackedCount() >= 150 && load.hits.Load() >= 50
	}), wait.Timeout(2*time.Minute), wait.Gap(50*time.Millisecond)),
		must.Func(func() string {
			return fmt.Sprintf("LMCache-shaped load before the kill: %d chunks acknowledged, %d hits", load.ackedCount(), load.hits.Load())
		}))
	must.Greater(t, int64(0), infoInt(t, ctx, ctl, "kvcached", "disk_blocks"))

	pid := kvcachedPid(t, ctx, ctl, kv.dataDir)
	// The kill lands just after a chunk was acknowledged, while its metadata (and perhaps its
	// kv_bytes) still waits for the disk: the moment the documented loss is about.
	acked := load.ackedCount()
	testutil.EventuallyEvery(t, 10*time.Second, time.Millisecond, "one more acknowledged write", func() bool { return load.ackedCount() > acked })
	killedAt := time.Now()
	must.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	hitsAtKill := load.hits.Load()

	// The outage ends when the process Nomad restarted answers.
	var recoveredAt time.Time
	testutil.EventuallyEvery(t, time.Minute, 20*time.Millisecond, "kvcached back after SIGKILL", func() bool {
		if !pongs(ctx, kv.addr) {
			return false
		}
		recoveredAt = time.Now()
		return true
	})
	newPid := kvcachedPid(t, ctx, ctl, kv.dataDir)
	must.NotEq(t, pid, newPid, must.Sprint("the kvcached answering after the kill is the one killed"))
	hitsAtRecovery := load.hits.Load()
	ackedAtRecovery := load.ackedCount()

	// The load goes on against the restarted process: it serves blocks kept on disk and takes new ones.
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		return load.ackedCount() >= ackedAtRecovery+100 && load.hits.Load() >= hitsAtRecovery+50
	}), wait.Timeout(2*time.Minute), wait.Gap(50*time.Millisecond)),
		must.Func(func() string {
			return fmt.Sprintf("LMCache-shaped load after the restart: %d chunks acknowledged, %d hits",
				load.ackedCount()-ackedAtRecovery, load.hits.Load()-hitsAtRecovery)
		}))
	stopLoad()

	restarts, stoppedFor := taskRestart(t, ctx, kv.allocID, killedAt)
	must.Eq(t, uint64(1), restarts, must.Sprint("Nomad restarted the task once"))

	// Every acknowledged chunk, read back as LMCache would.
	check := load.verify(t, ctx, killedAt, recoveredAt)
	corruptDropped := metric(t, ctx, kv.httpAddr, "oasis_kvcached_corrupt_blocks_total")
	diskHits := metric(t, ctx, kv.httpAddr, `oasis_kvcached_hits_total{tier="disk"}`)

	byKind := map[string]int{}
	var firstErr, lastErr time.Duration
	for i, e := range load.errs {
		byKind[errorKind(e.err)]++
		if d := e.at.Sub(killedAt); i == 0 || d < firstErr {
			firstErr = d
		}
		if d := e.at.Sub(killedAt); d > lastErr {
			lastErr = d
		}
	}
	t.Logf("written: %d chunks acknowledged (%d MiB of kv_bytes), %d before the kill; %d writes not acknowledged (%d after kv_bytes was stored)",
		len(load.acked), check.bytes>>20, check.beforeKill, load.unacked.Load(), load.halfWritten.Load())
	t.Logf("outage: kill to first answer %s (Nomad: exit to restart %s); %d client errors %v, %s to %s after the kill",
		recoveredAt.Sub(killedAt).Round(time.Millisecond), stoppedFor.Round(time.Millisecond), len(load.errs), byKind,
		firstErr.Round(time.Millisecond), lastErr.Round(time.Millisecond))
	t.Logf("reads: %d lookups served and verified (%d before the kill, %d during and after the restart), %d misses; kvcached: %.0f disk hits, %.0f corrupt blocks dropped",
		load.hits.Load(), hitsAtKill, load.hits.Load()-hitsAtKill, load.misses.Load(), diskHits, corruptDropped)
	t.Logf("lost: %d chunks (%d without metadata, %d with metadata but no kv_bytes), %d KiB of kv_bytes (RAM tier %d KiB), acknowledged %s to %s before the kill; corrupt answers: %d",
		check.lost, check.lostMetadata, check.lostBytes, check.lostKVBytes>>10, ramLimit>>10,
		check.youngestLost, check.oldestLost, len(load.corrupt)+len(check.corrupt))

	must.SliceEmpty(t, load.corrupt, must.Sprint("readers were served corrupt chunks"))
	must.SliceEmpty(t, check.corrupt, must.Sprint("corrupt chunks after the restart"))
	must.Eq(t, 0.0, corruptDropped, must.Sprint("kvcached found corrupt blocks on its disk tier"))
	must.Greater(t, 0.0, diskHits, must.Sprint("the restarted kvcached served nothing from its disk tier"))

	must.SliceNotEmpty(t, load.errs, must.Sprint("no client saw the outage: was the process killed?"))
	for _, e := range load.errs {
		must.True(t, !e.at.Before(killedAt) && !e.at.After(recoveredAt.Add(errorGrace)),
			must.Sprintf("%s failed %s after the kill, outside the outage (kill to first answer %s, + %s): %v",
				e.op, e.at.Sub(killedAt), recoveredAt.Sub(killedAt), errorGrace, e.err))
	}

	must.Zero(t, check.lostAfterRecovery, must.Sprint("chunks acknowledged after the restart were lost"))
	must.LessEq(t, ramLimit, check.lostKVBytes, must.Sprint("lost more kv_bytes than the RAM tier holds"))
	must.LessEq(t, lossWindow, check.oldestLost, must.Sprint("lost a chunk acknowledged long before the kill"))
}

const (
	lmcacheWriters = 4
	lmcacheReaders = 4
	// writePause spaces each writer's chunks (at most 40 chunks a second in all), so the load
	// stays modest on a shared machine and the disk tier a few hundred MiB.
	writePause = 100 * time.Millisecond
	readPause  = 50 * time.Millisecond
	// errorPause is how long a worker waits after an error, as a client that backs off: without
	// it the outage is a busy loop of refused connections.
	errorPause = 50 * time.Millisecond
	// errorGrace is how long after the restarted process answers clients may still fail: once a
	// go-redis pool has failed to dial PoolSize times it answers with that error without dialing,
	// and probes the address once a second until a dial succeeds.
	errorGrace = 2 * time.Second
	// lossWindow bounds how long before the kill a lost chunk can have been acknowledged. The
	// store writes a block within milliseconds of its SET when the disk keeps up; the margin is
	// for a spiller starved of CPU on a loaded machine, not for the disk.
	lossWindow = time.Second
)

// kvcached is the running job's instance.
type kvcached struct {
	addr, httpAddr, dataDir, allocID string
}

// runKvcached runs the real jobs/kvcached.nomad.hcl, as `nomad job run -var ...` would, with free
// loopback ports, a small RAM tier and its SSD tier in a temporary directory, and waits until
// Consul sees it healthy. The job is stopped when the test ends.
func runKvcached(t *testing.T, ctx context.Context) kvcached {
	t.Helper()
	return runKvcachedVars(t, ctx, nil)
}

// runKvcachedVars is runKvcached with more job variables (or other values for its own).
func runKvcachedVars(t *testing.T, ctx context.Context, extra map[string]string) kvcached {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	ports, err := testutil.FreePorts(3)
	must.NoError(t, err)
	dataDir := filepath.Join(t.TempDir(), "kvcached")
	vars := map[string]string{
		"oasis_bin_dir":     stack.BinDir,
		"consul_addr":       stack.ConsulAddr,
		"resp_port":         strconv.Itoa(ports[0]),
		"http_port":         strconv.Itoa(ports[1]),
		"quic_port":         strconv.Itoa(ports[2]),
		"kv_events_address": "127.0.0.1",
		"data_dir":          dataDir,
		// The RAM tier gets part of this (INFO's ram_limit_bytes), a few dozen chunks: most of
		// the load's chunks live only on disk.
		"ram_bytes":  "64MiB",
		"disk_bytes": "2GiB",
		"memory_mb":  "256",
		// The load's LMCache-shaped client sends no password; test/e2e/tiers covers the
		// password (the job's default).
		"auth_enabled": "false",
	}
	maps.Copy(vars, extra)
	const jobID = "oasis-kvcached"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := stack.StopJob(ctx, jobID); err != nil {
			t.Errorf("stopping %s: %v", jobID, err)
		}
	})
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "kvcached.nomad.hcl"), vars))
	allocs, err := stack.WaitAllocsRunning(ctx, jobID)
	must.NoError(t, err)
	must.Len(t, 1, allocs)
	return kvcached{
		addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		httpAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		dataDir:  dataDir,
		allocID:  allocs[0].ID,
	}
}

// kvcachedPid is the pid of the kvcached serving ctl, as its INFO reports it, after checking that
// the process is the job's oasis-kvcached on this test's data directory: nothing else is killed.
func kvcachedPid(t *testing.T, ctx context.Context, ctl *redis.Client, dataDir string) int {
	t.Helper()
	pid := int(infoInt(t, ctx, ctl, "server", "process_id"))
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	must.NoError(t, err)
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	must.Eq(t, "oasis-kvcached", filepath.Base(args[0]), must.Sprintf("process %d: %q", pid, args))
	// The job passes its settings in a config file (--config local/kvcached.hcl).
	must.Eq(t, 3, len(args), must.Sprintf("process %d: %q", pid, args))
	must.Eq(t, "--config", args[1], must.Sprintf("process %d: %q", pid, args))
	conf, err := os.ReadFile(args[2])
	must.NoError(t, err)
	must.StrContains(t, string(conf), strconv.Quote(dataDir), must.Sprintf("process %d is not this test's kvcached: %s", pid, conf))
	return pid
}

// taskRestart reports how often Nomad restarted the kvcached task and how long it stayed down
// after the kill (the restart block's delay, with Nomad's jitter, and the start).
func taskRestart(t *testing.T, ctx context.Context, allocID string, killedAt time.Time) (uint64, time.Duration) {
	t.Helper()
	alloc, _, err := stack.Nomad.Allocations().Info(allocID, (&nomadapi.QueryOptions{}).WithContext(ctx))
	must.NoError(t, err)
	state := alloc.TaskStates["kvcached"]
	must.NotNil(t, state)
	var terminated, started time.Time
	for _, e := range state.Events {
		at := time.Unix(0, e.Time)
		switch {
		case e.Type == nomadapi.TaskTerminated && at.After(killedAt.Add(-time.Second)) && terminated.IsZero():
			terminated = at
			must.Eq(t, int(syscall.SIGKILL), e.Signal, must.Sprintf("task terminated: %s", e.DisplayMessage))
		case e.Type == nomadapi.TaskStarted && !terminated.IsZero() && at.After(terminated):
			started = at
		}
	}
	must.False(t, terminated.IsZero(), must.Sprint("no Terminated event after the kill"))
	must.False(t, started.IsZero(), must.Sprint("no Started event after the kill"))
	return state.Restarts, started.Sub(terminated)
}

// kvcachedClientOptions is how every client of the test reaches kvcached: one pool shared by the
// load's workers, as LMCache's connector shares its connections. A failed command is not retried
// (redis-py, under LMCache, does not retry either), so each one the outage costs is counted.
func kvcachedClientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:          addr,
		PoolSize:      lmcacheWriters + lmcacheReaders + 2,
		MaxRetries:    -1,
		DialerRetries: 1,
		DialTimeout:   time.Second,
		// A 2 MiB value on a loaded machine: generous, but an outage shows as refused or reset
		// connections long before this.
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
	}
}

// pongs reports whether a kvcached answers PING at addr now, on a connection of its own: a go-redis
// pool whose dials failed waits a second between dials (errorGrace), so it would see the end of the
// outage late.
func pongs(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return false
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}

// infoInt reads one integer field of a kvcached INFO section.
func infoInt(t *testing.T, ctx context.Context, c *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Info(ctx, section).Result()
	must.NoError(t, err)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			must.NoError(t, err)
			return n
		}
	}
	t.Fatalf("INFO %s has no %s:\n%s", section, field, info)
	return 0
}

// metric reads one unlabelled or exactly labelled sample from kvcached's /metrics; absent is 0.
func metric(t *testing.T, ctx context.Context, httpAddr, series string) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	must.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			must.NoError(t, err)
			return f
		}
	}
	must.NoError(t, sc.Err())
	return 0
}

func errorKind(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken pipe"
	case errors.Is(err, io.EOF):
		return "eof"
	}
	return "other"
}

// The LMCache-shaped load.
//
// A chunk's key is LMCache's K = "{model}@{world_size}@{worker_id}@{chunk_hash_hex}@{dtype}",
// stored as K+"kv_bytes" and K+"metadata". Both values verify on their own and against each
// other:
//
//	kv_bytes: "LMKV" | key hash (8) | body length u64 | SHA-256(body)[:16] | body
//	metadata: "LMMD" | key hash (8) | kv_bytes length u32 | SHA-256(body)[:12]   (28 bytes, as LMCache's)
//
// where the key hash is SHA-256(K)[:8]. A value served for another key, torn, or paired with
// another write's metadata fails the check.
const (
	lmcacheModel   = "meta-llama/Llama-3.1-8B-Instruct"
	kvHeaderLen    = 4 + 8 + 8 + 16
	metadataLen    = 28
	minChunkBytes  = 256 << 10
	maxChunkBytes  = 2 << 20
	chunkBodyBytes = 4 << 20 // the random bytes bodies are cut from
)

func chunkKey(worker, i int) string {
	h := sha256.Sum256(fmt.Appendf(nil, "chunk %d/%d", worker, i))
	return fmt.Sprintf("%s@1@%d@%x@bfloat16", lmcacheModel, worker, h[:8])
}

func keyHash(k string) []byte {
	h := sha256.Sum256([]byte(k))
	return h[:8]
}

// encodeChunk builds K's values; the body's size and bytes follow from the key.
func encodeChunk(k string, random []byte) (kv, meta []byte) {
	kh := keyHash(k)
	seed := binary.LittleEndian.Uint64(kh)
	size := minChunkBytes + int(seed%uint64(maxChunkBytes-minChunkBytes))
	off := int(seed>>32) % (len(random) - size)
	body := random[off : off+size]
	sum := sha256.Sum256(body)
	kv = make([]byte, 0, kvHeaderLen+size)
	kv = append(kv, "LMKV"...)
	kv = append(kv, kh...)
	kv = binary.LittleEndian.AppendUint64(kv, uint64(size))
	kv = append(kv, sum[:16]...)
	kv = append(kv, body...)
	meta = make([]byte, 0, metadataLen)
	meta = append(meta, "LMMD"...)
	meta = append(meta, kh...)
	meta = binary.LittleEndian.AppendUint32(meta, uint32(len(kv)))
	meta = append(meta, sum[:12]...)
	return kv, meta
}

// checkChunk verifies K's values as served together.
func checkChunk(k string, meta, kv []byte) error {
	kh := keyHash(k)
	if len(meta) != metadataLen || string(meta[:4]) != "LMMD" || !bytes.Equal(meta[4:12], kh) {
		return fmt.Errorf("metadata of %d bytes is not this key's", len(meta))
	}
	if len(kv) < kvHeaderLen || string(kv[:4]) != "LMKV" || !bytes.Equal(kv[4:12], kh) {
		return fmt.Errorf("kv_bytes of %d bytes is not this key's", len(kv))
	}
	body := kv[kvHeaderLen:]
	if n := binary.LittleEndian.Uint64(kv[12:]); n != uint64(len(body)) {
		return fmt.Errorf("kv_bytes body is %d bytes, its header says %d", len(body), n)
	}
	sum := sha256.Sum256(body)
	if !bytes.Equal(kv[20:36], sum[:16]) {
		return errors.New("kv_bytes body fails its checksum")
	}
	if n := binary.LittleEndian.Uint32(meta[12:]); n != uint32(len(kv)) || !bytes.Equal(meta[16:28], sum[:12]) {
		return fmt.Errorf("metadata describes %d bytes of other content, kv_bytes is %d bytes", n, len(kv))
	}
	return nil
}

type ackedChunk struct {
	key string
	kv  int // kv_bytes length
	at  time.Time
}

type clientError struct {
	at  time.Time
	op  string
	err error
}

type lmcacheLoad struct {
	rdb    *redis.Client
	random []byte

	mu      sync.Mutex
	acked   []ackedChunk
	errs    []clientError
	corrupt []string
	// metaOnly holds chunks whose metadata a reader found without kv_bytes (and deleted, as
	// LMCache does).
	metaOnly map[string]bool

	hits, misses         atomic.Int64
	unacked, halfWritten atomic.Int64
}

func newLMCacheLoad(addr string) *lmcacheLoad {
	random := make([]byte, chunkBodyBytes)
	rng := rand.NewChaCha8([32]byte{'o', 'a', 's', 'i', 's'})
	_, _ = rng.Read(random)
	return &lmcacheLoad{rdb: redis.NewClient(kvcachedClientOptions(addr)), random: random, metaOnly: map[string]bool{}}
}

func (l *lmcacheLoad) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

func (l *lmcacheLoad) failed(op string, err error) {
	l.mu.Lock()
	l.errs = append(l.errs, clientError{at: time.Now(), op: op, err: err})
	l.mu.Unlock()
}

func (l *lmcacheLoad) corrupted(format string, args ...any) {
	l.mu.Lock()
	l.corrupt = append(l.corrupt, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

// pause waits d unless the load stops first.
func pause(stop <-chan struct{}, d time.Duration) bool {
	select {
	case <-stop:
		return false
	case <-time.After(d):
		return true
	}
}

// write stores new chunks as LMCache's put does: kv_bytes, then metadata. A chunk counts as
// acknowledged once both SETs succeeded; a failed one is not retried (LMCache moves on).
func (l *lmcacheLoad) write(ctx context.Context, stop <-chan struct{}, worker int) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		k := chunkKey(worker, i)
		kv, meta := encodeChunk(k, l.random)
		next := writePause
		if err := l.rdb.Set(ctx, k+"kv_bytes", kv, 0).Err(); err != nil {
			l.failed("SET kv_bytes", err)
			l.unacked.Add(1)
			next = errorPause
		} else if err := l.rdb.Set(ctx, k+"metadata", meta, 0).Err(); err != nil {
			l.failed("SET metadata", err)
			l.unacked.Add(1)
			l.halfWritten.Add(1)
			next = errorPause
		} else {
			l.mu.Lock()
			l.acked = append(l.acked, ackedChunk{key: k, kv: len(kv), at: time.Now()})
			l.mu.Unlock()
		}
		if !pause(stop, next) {
			return
		}
	}
}

// read looks chunks up as LMCache's lookup and get do: EXISTS K+"metadata", GET the metadata, GET
// kv_bytes, DEL the metadata when kv_bytes is gone. One lookup in four is for a chunk never
// written, which must miss.
func (l *lmcacheLoad) read(ctx context.Context, stop <-chan struct{}, reader int) {
	rng := rand.New(rand.NewPCG(uint64(reader), 19))
	for n := 0; pause(stop, readPause); n++ {
		var k string
		written := n%4 != 0
		if written {
			l.mu.Lock()
			if len(l.acked) == 0 {
				l.mu.Unlock()
				continue
			}
			k = l.acked[rng.IntN(len(l.acked))].key
			l.mu.Unlock()
		} else {
			k = chunkKey(1000+reader, n)
		}
		if err := l.lookup(ctx, k, written); err != nil {
			if !pause(stop, errorPause) {
				return
			}
		}
	}
}

// lookup is one LMCache lookup and get of K; it returns the error it counted, if any.
func (l *lmcacheLoad) lookup(ctx context.Context, k string, written bool) error {
	n, err := l.rdb.Exists(ctx, k+"metadata").Result()
	if err != nil {
		l.failed("EXISTS metadata", err)
		return err
	}
	if n == 0 {
		if written {
			l.misses.Add(1)
		}
		return nil
	}
	if !written {
		l.corrupted("EXISTS found %s, never written", k)
		return nil
	}
	meta, err := l.rdb.Get(ctx, k+"metadata").Bytes()
	if errors.Is(err, redis.Nil) {
		l.misses.Add(1)
		return nil
	}
	if err != nil {
		l.failed("GET metadata", err)
		return err
	}
	kv, err := l.rdb.Get(ctx, k+"kv_bytes").Bytes()
	if errors.Is(err, redis.Nil) {
		l.misses.Add(1)
		l.mu.Lock()
		l.metaOnly[k] = true
		l.mu.Unlock()
		if err := l.rdb.Del(ctx, k+"metadata").Err(); err != nil {
			l.failed("DEL metadata", err)
			return err
		}
		return nil
	}
	if err != nil {
		l.failed("GET kv_bytes", err)
		return err
	}
	if err := checkChunk(k, meta, kv); err != nil {
		l.corrupted("%s: %v", k, err)
		return nil
	}
	l.hits.Add(1)
	return nil
}

// chunkCheck is what reading back every acknowledged chunk found.
type chunkCheck struct {
	bytes      int64 // kv_bytes of every acknowledged chunk
	beforeKill int   // chunks acknowledged before the kill
	corrupt    []string
	// lost: acknowledged chunks LMCache can no longer get. lostMetadata have no metadata (EXISTS
	// misses); lostBytes have metadata without kv_bytes (or had, until a reader deleted it).
	lost, lostMetadata, lostBytes int
	lostKVBytes                   int64
	lostAfterRecovery             int
	// youngestLost and oldestLost: how long before the kill the lost chunks were acknowledged.
	youngestLost, oldestLost time.Duration
}

// verify reads back every acknowledged chunk as LMCache's get does, after the load has stopped.
func (l *lmcacheLoad) verify(t *testing.T, ctx context.Context, killedAt, recoveredAt time.Time) chunkCheck {
	t.Helper()
	var c chunkCheck
	var mu sync.Mutex
	acked := slices.Clone(l.acked)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(acked) {
					return
				}
				a := acked[i]
				meta, merr := l.rdb.Get(ctx, a.key+"metadata").Bytes()
				kv, kerr := l.rdb.Get(ctx, a.key+"kv_bytes").Bytes()
				mu.Lock()
				c.bytes += int64(a.kv)
				if a.at.Before(killedAt) {
					c.beforeKill++
				}
				switch {
				case merr != nil && !errors.Is(merr, redis.Nil), kerr != nil && !errors.Is(kerr, redis.Nil):
					c.corrupt = append(c.corrupt, fmt.Sprintf("%s: read back: %v %v", a.key, merr, kerr))
				case merr == nil && kerr == nil:
					if err := checkChunk(a.key, meta, kv); err != nil {
						c.corrupt = append(c.corrupt, fmt.Sprintf("%s: %v", a.key, err))
					}
				default:
					c.lost++
					c.lostKVBytes += int64(a.kv)
					if merr == nil || l.metaOnly[a.key] {
						c.lostBytes++
					} else {
						c.lostMetadata++
					}
					if a.at.After(recoveredAt) {
						c.lostAfterRecovery++
					}
					age := killedAt.Sub(a.at)
					if c.lost == 1 || age < c.youngestLost {
						c.youngestLost = age
					}
					c.oldestLost = max(c.oldestLost, age)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return c
}
