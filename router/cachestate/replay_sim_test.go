package cachestate

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/tokens"
	"github.com/shoenig/test/must"
)

// cutProxy forwards TCP from a loopback port to target and can cut every
// connection and refuse new ones for a while: a network partition between
// the router and an engine's KV events socket.
type cutProxy struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{addr: testutil.FreeAddr(t), target: target}
	must.NoError(t, p.open())
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) open() error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	return nil
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestReplayAcrossPartitionWithRealOasisSim cuts the connection between the
// router's subscriber and a real oasis-sim's KV events socket, serves a
// prompt while the events cannot arrive, and heals the partition. With the
// engine's replay endpoint the worker keeps its entries and learns the
// blocks stored during the partition; without it, the same gap drops them.
func TestReplayAcrossPartitionWithRealOasisSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	for _, withReplay := range []bool{true, false} {
		t.Run(fmt.Sprintf("replay=%v", withReplay), func(t *testing.T) {
			apiPort, evPort, replayPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
			sim := startSim(t, bin, apiPort, evPort, replayPort)
			proxy := newCutProxy(t, fmt.Sprintf("127.0.0.1:%d", evPort))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := New(Config{})
			defer s.Close()
			eng := Engine{ID: "sim-1", Model: "sim-model", Address: sim.Addr, BlockSize: 16, KVEvents: "tcp://" + proxy.addr}
			if withReplay {
				eng.KVEventsReplay = fmt.Sprintf("tcp://*:%d", replayPort) // wildcard host: the engine's address
			}
			s.Sync(ctx, []Engine{eng})

			keysOf := func(body string) []uint64 {
				req, err := openai.ParseRequest("/v1/completions", []byte(body))
				must.NoError(t, err)
				toks, err := tokens.Sim{}.Tokenize(ctx, "sim-model", req.Prompt)
				must.NoError(t, err)
				k, err := s.Keys(nil, "sim-model", 16, toks)
				must.NoError(t, err)
				return k
			}
			// serveUntil serves fresh prompts until cond holds (a PUB socket drops
			// what it publishes before the subscription is up).
			serveUntil := func(what string, cond func() bool) {
				i := 0
				testutil.EventuallyEvery(t, 20*time.Second, 100*time.Millisecond, what, func() bool {
					if cond() {
						return true
					}
					i++
					complete(t, sim, completionBody(fmt.Sprintf("%s %d %s", what, i, strings.Repeat("y ", 40))))
					return false
				})
			}
			stats := func() EventStats { st, _ := s.EngineStats("sim-1"); return st }
			serveUntil("warm up", func() bool { return stats().Batches > 0 })

			before := completionBody("Before the partition. " + strings.Repeat("All work and no play makes Jack a dull boy. ", 12))
			kb := keysOf(before)
			complete(t, sim, before)
			serveUntil("before", func() bool { return matchBlocks(s, kb, "sim-1") == len(kb) })
			resyncs, replays := stats().Resyncs, stats().Replays

			proxy.cut()
			during := completionBody("During the partition. " + strings.Repeat("Events published now never reach the router. ", 12))
			kd := keysOf(during)
			complete(t, sim, during)
			// cut closed the listener and every connection through it: nothing the
			// engine published for this request can reach the router until open.
			must.Eq(t, 0, matchBlocks(s, kd, "sim-1"), must.Sprint("events crossed the partition"))
			must.NoError(t, proxy.open())

			// The subscriber redials; the first batch after it shows the gap.
			batches := stats().Batches
			serveUntil("after", func() bool { return stats().Batches > batches })
			if withReplay {
				must.Eq(t, len(kb), matchBlocks(s, kb, "sim-1"), must.Sprint("entries from before the partition must survive"))
				must.Eq(t, len(kd), matchBlocks(s, kd, "sim-1"), must.Sprint("blocks stored during the partition come from the replay"))
				must.Eq(t, resyncs, stats().Resyncs)
				must.Greater(t, replays, stats().Replays)
			} else {
				must.Eq(t, 0, matchBlocks(s, kb, "sim-1"), must.Sprint("without replay the gap must drop the entries"))
				must.Eq(t, 0, matchBlocks(s, kd, "sim-1"))
				must.Greater(t, resyncs, stats().Resyncs)
			}
		})
	}
}
