package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/kvcached/app"
)

// TestUnauthenticatedConnectionsStayWithinRAMLimit fills the RAM tier of a
// 256 MiB budget, then opens 9,600 connections that each send, without
// authenticating, a 10-argument command of 16 KiB arguments (the most Redis
// lets a client send before AUTH) with its last argument cut short, and keep
// it pending. RSS stays within the budget + 10%, the bytes charged to
// unauthenticated connections within their allowance, and an authenticated
// client is served throughout. Before the allowance each such connection
// held a 64 KiB read buffer and its arguments: RSS reached ~0.8 GB.
func TestUnauthenticatedConnectionsStayWithinRAMLimit(t *testing.T) {
	const ram = 256 << 20
	addr, httpAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(binary, "--addr", addr, "--http-addr", httpAddr, "--ram-bytes", strconv.Itoa(ram), "--auth-timeout", "60s")
	cmd.Env = append(cmd.Environ(), "OASIS_KVCACHED_PASSWORD=s3cret")
	p := &proc{Process: testutil.Start(t, cmd), addr: addr, httpAddr: httpAddr}
	ctx := context.Background()
	good := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret", PoolSize: 1, ReadTimeout: 5 * time.Second, MaxRetries: -1})
	defer good.Close()
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error { return good.Ping(ctx).Err() }),
		wait.Timeout(15*time.Second), wait.Gap(50*time.Millisecond)))
	val := bytes.Repeat([]byte{1}, 1<<20)
	fill := func(from int) {
		pipe := good.Pipeline()
		for i := from; i < from+ram>>20; i++ {
			pipe.Set(ctx, blockKey(i), val, 0)
			if i%16 == 15 {
				_, err := pipe.Exec(ctx)
				must.NoError(t, err)
			}
		}
		_, err := pipe.Exec(ctx)
		must.NoError(t, err)
	}
	fill(0)

	var partial bytes.Buffer
	arg := strings.Repeat("x", 16384)
	partial.WriteString("*10\r\n")
	for i := 0; i < 9; i++ {
		fmt.Fprintf(&partial, "$16384\r\n%s\r\n", arg)
	}
	fmt.Fprintf(&partial, "$16384\r\n%s", arg[:1000])
	const conns = 9600
	var (
		mu   sync.Mutex
		open []net.Conn
		wg   sync.WaitGroup
	)
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	sem := make(chan struct{}, 64)
	for i := 0; i < conns; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			c.Write(partial.Bytes()) // fails once the server closed it
		}()
	}
	wg.Wait()
	// Every connection was taken in: it is pending, or the server closed it
	// (the oldest to make room for newer ones, or one whose arguments did
	// not fit).
	closed := func() float64 {
		return p.metric(t, `oasis_kvcached_connections_closed_total{reason="unauthenticated_evicted"}`) +
			p.metric(t, `oasis_kvcached_connections_closed_total{reason="unauthenticated_memory"}`)
	}
	testutil.EventuallyEvery(t, 60*time.Second, 100*time.Millisecond, "every unauthenticated connection to be held or closed", func() bool {
		return closed()+p.metric(t, "oasis_kvcached_unauthenticated_connections") >= conns
	})
	// The authenticated client is served while they are pending.
	fill(ram >> 20)
	got, err := good.Get(ctx, blockKey(2*ram>>20-1)).Bytes()
	must.NoError(t, err)
	must.True(t, bytes.Equal(val, got))

	plan, err := app.PlanMemory(ram, 64<<20, false)
	must.NoError(t, err)
	used := p.metric(t, "oasis_kvcached_unauthenticated_bytes")
	hwm := peakRSS(t, p.Pid())
	t.Logf("peak RSS %d MiB for --ram-bytes %d MiB; unauthenticated: %.0f bytes of %d in %.0f connections, %.0f closed",
		hwm>>20, ram>>20, used, plan.Unauth, p.metric(t, "oasis_kvcached_unauthenticated_connections"), closed())
	must.LessEq(t, float64(plan.Unauth), used)
	must.LessEq(t, int64(ram)*11/10, hwm)
}
