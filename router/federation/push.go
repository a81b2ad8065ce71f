package federation

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/internal/bloom"
)

// HotKeys remembers the most recent prompt block keys of one model, the
// source of its summary's prefix filter. Exported so the cluster simulator
// builds its summaries with the router's own code.
type HotKeys struct {
	keys []uint64
	next int
	full bool
}

// NewHotKeys remembers the last n keys (n ≥ 1).
func NewHotKeys(n int) *HotKeys { return &HotKeys{keys: make([]uint64, max(n, 1))} }

// Add remembers ks, forgetting the oldest keys past capacity.
func (h *HotKeys) Add(ks []uint64) {
	for _, k := range ks {
		h.keys[h.next] = k
		h.next = (h.next + 1) % len(h.keys)
		h.full = h.full || h.next == 0
	}
}

// Filter is a Bloom filter of the remembered keys (nil: none).
func (h *HotKeys) Filter() *bloom.Filter {
	n := h.next
	if h.full {
		n = len(h.keys)
	}
	if n == 0 {
		return nil
	}
	f := bloom.New(n)
	for _, k := range h.keys[:n] {
		f.Add(PrefixKey(k))
	}
	return f
}

// Observe records the prompt block keys of a request served locally: the
// prefixes this datacenter's caches now hold, as far as other datacenters
// are told. Keys are scoring's prefix keys (Request.PrefixResult).
func (f *Federation) Observe(model string, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hot[model]
	if h == nil {
		if len(f.hot) >= MaxModels {
			return
		}
		h = NewHotKeys(f.cfg.HotKeys)
		f.hot[model] = h
	}
	h.Add(keys[:min(len(keys), f.cfg.HotKeys)])
}

// LocalSummary builds this datacenter's summary now.
func (f *Federation) LocalSummary() *Summary {
	ms := f.cfg.Local()
	ms = ms[:min(len(ms), MaxModels)]
	f.mu.Lock()
	for i := range ms {
		if h := f.hot[ms[i].Model]; h != nil {
			ms[i].Prefixes = h.Filter()
		}
	}
	f.mu.Unlock()
	return &Summary{DC: f.cfg.DC, At: f.cfg.now(), Models: ms}
}

// pushLoop sends this datacenter's summary to every known peer every
// Interval until ctx ends.
func (f *Federation) pushLoop(ctx context.Context) {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		f.pushOnce(ctx)
		f.expire(f.cfg.now())
		f.updateGauges()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pushOnce sends one summary to all peers at once, each push under its own
// timeout.
func (f *Federation) pushOnce(ctx context.Context) {
	body, err := f.LocalSummary().MarshalBinary()
	if err != nil {
		f.log.Error("encoding the summary failed", "error", err)
		return
	}
	f.m.summaryBytes.Set(float64(len(body)))
	var wg sync.WaitGroup
	for _, p := range f.allPeers() {
		wg.Add(1)
		go func() { defer wg.Done(); f.push(ctx, p, body) }()
	}
	wg.Wait()
}

func (f *Federation) allPeers() []Peer {
	var out []Peer
	for _, ps := range f.peers.snapshot() {
		out = append(out, ps...)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(out, f.static...)
}

// peerDC is the datacenter the peer at addr was found for ("" if none).
func (f *Federation) peerDC(addr string) string {
	for _, p := range f.allPeers() {
		if p.Addr == addr {
			return p.DC
		}
	}
	return ""
}

func (f *Federation) push(ctx context.Context, p Peer, body []byte) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PushTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+p.Addr+SummaryPath, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set(FromHeader, f.cfg.DC)
	req.Header.Set(RouterHeader, f.cfg.Name)
	t0 := f.cfg.now()
	resp, err := f.rt.RoundTrip(req)
	if err != nil {
		f.log.Debug("pushing the summary failed", "dc", p.DC, "peer", p.Addr, "error", err)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		f.log.Warn("a peer refused the summary", "dc", p.DC, "peer", p.Addr, "status", resp.Status)
		return
	}
	rtt := f.cfg.now().Sub(t0)
	f.m.rtt.WithLabelValues(p.DC).Observe(rtt.Seconds())
	f.mu.Lock()
	rd := f.remoteLocked(p.DC)
	if rd.rtt == 0 {
		rd.rtt = rtt
	} else {
		rd.rtt = (rd.rtt*7 + rtt) / 8 // smoothed: one slow push does not turn routing
	}
	f.mu.Unlock()
}

// updateGauges refreshes the per-datacenter gauges.
func (f *Federation) updateGauges() {
	now, fresh := f.cfg.now(), f.cfg.Policy().SummaryStale
	f.mu.Lock()
	defer f.mu.Unlock()
	for dc, rd := range f.remote {
		if !rd.received.IsZero() {
			f.m.summaryAge.WithLabelValues(dc).Set(now.Sub(rd.received).Seconds())
		}
		n, inFlight := 0, 0.0
		for _, r := range rd.routers {
			if now.Sub(r.received) <= fresh {
				n++
				for _, m := range r.models {
					inFlight += float64(m.InFlight)
				}
			}
		}
		f.m.routers.WithLabelValues(dc).Set(float64(n))
		f.m.remoteInFlight.WithLabelValues(dc).Set(inFlight)
		rd.breaker.mu.Lock()
		st := rd.breaker.state
		rd.breaker.mu.Unlock()
		f.m.breaker.WithLabelValues(dc).Set(float64(st))
	}
}

// RemoteDCs lists the datacenters with state, sorted.
func (f *Federation) RemoteDCs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.remote))
	for dc := range f.remote {
		out = append(out, dc)
	}
	slices.Sort(out)
	return out
}
