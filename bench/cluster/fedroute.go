package cluster

import (
	"time"

	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/scoring"
)

// The router side of federation in the simulator, in the gateway's order
// (router/gateway/federate.go): a request that did not come from another
// datacenter is counted for the spill budget, asked about before admission
// when admission would make it wait past the budget, and asked again once
// its local worker is chosen, with that worker's cached prefix. A request
// that stays is remembered in the datacenter's hot prefixes.

// arrive handles request idx reaching d's router.
func (f *fed) arrive(d *dcState, idx int, now int64) error {
	d.s.sampleImbalance()
	if !f.forwarded[idx] && f.cfg.Federation == FedOasis {
		d.spill.Record(vtime(now), false)
		if sat, wait := f.pressure(d); sat || wait > f.set.QueueWaitBudget {
			l := federation.Local{Healthy: true, Saturated: sat, QueueWait: wait}
			dec := federation.Decide(f.set, false, d.spill.Paused(vtime(now), f.set.MaxSpillFraction, f.set.ResumeSpillFraction),
				l, f.remotes(d, nil, now))
			if dec.DC != "" {
				f.forward(d, dec.DC, idx, now)
				return nil
			}
		}
	}
	d.waiting = append(d.waiting, idx)
	return f.admitWaiting(d, now)
}

// pressure is the gateway's localPressure: whether admission would refuse
// a request (never here: its queue is unbounded) and the estimated wait for
// a slot.
func (f *fed) pressure(d *dcState) (saturated bool, wait time.Duration) {
	c := f.cfg.MaxInFlight
	if c <= 0 || d.inflight < c {
		return false, 0
	}
	return false, time.Duration(float64(len(d.waiting)+1) * float64(d.svcMean) / float64(c))
}

// admitWaiting admits queued requests while slots are free.
func (f *fed) admitWaiting(d *dcState, now int64) error {
	for len(d.waiting) > 0 && (f.cfg.MaxInFlight <= 0 || d.inflight < f.cfg.MaxInFlight) {
		idx := d.waiting[0]
		d.waiting = d.waiting[1:]
		d.inflight++
		if err := f.dispatch(d, idx, now); err != nil {
			return err
		}
	}
	return nil
}

// dispatch picks request idx's local worker, asks the federation again
// with its cached prefix, and submits it there or forwards it.
func (f *fed) dispatch(d *dcState, idx int, now int64) error {
	w, req, err := d.s.pick(idx)
	if err != nil {
		return err
	}
	var keys []uint64
	if req != nil {
		keys, _, _ = req.PrefixResult(w.id)
	}
	if !f.forwarded[idx] && len(keys) > 0 {
		if dc := f.decideChosen(d, w, req, now); dc != "" {
			d.inflight-- // the local slot is not needed there
			f.forward(d, dc, idx, now)
			return nil
		}
		d.hot.Add(keys)
	}
	origin, extra := d.s.arrivalTime(d.s.reqs[idx]), int64(0)
	if f.forwarded[idx] {
		extra = int64(f.cfg.RTT / 2) // the response's way back
	}
	if !d.s.submit(idx, w, req, now, origin, extra) {
		d.inflight--
	}
	return nil
}

// decideChosen is federateChosen: where the request goes once w is chosen
// locally ("" stays).
func (f *fed) decideChosen(d *dcState, w *worker, req *scoring.Request, now int64) string {
	keys, matched, _ := req.PrefixResult(w.id)
	bs := int64(f.cfg.BlockSize)
	switch f.cfg.Federation {
	case FedBestPrefix:
		best, bestN := "", matched
		for j, p := range d.peers {
			if n := federation.CachedBlocks(p.sum.Prefixes, keys); n > bestN {
				best, bestN = f.dcs[j].name, n
			}
		}
		return best
	case FedOasis:
		uncached, _ := req.UncachedTokens(w.sw)
		cached := int64(matched) * bs
		l := federation.Local{Healthy: true, CachedTokens: cached, PromptTokens: cached + uncached,
			PrefillRate: w.sw.Signals().PrefillRate}
		paused := d.spill.Paused(vtime(now), f.set.MaxSpillFraction, f.set.ResumeSpillFraction)
		return federation.Decide(f.set, false, paused, l, f.remotes(d, keys, now)).DC
	}
	return ""
}

// remotes is Federation.remotes: each peer's offer from its latest summary.
// The simulated WAN never fails, so every breaker stays closed.
func (f *fed) remotes(d *dcState, keys []uint64, now int64) []federation.Remote {
	out := make([]federation.Remote, 0, len(d.peers))
	for j, p := range d.peers {
		m := p.sum
		out = append(out, federation.Remote{DC: f.dcs[j].name, RTT: f.cfg.RTT, QueueWait: m.QueueWait, TTFT: m.TTFT,
			CachedTokens: int64(federation.CachedBlocks(m.Prefixes, keys)) * int64(f.cfg.BlockSize),
			Usable:       time.Duration(now-p.received) <= f.set.SummaryStale && m.Free > 0})
	}
	return out
}

// forward sends request idx from d to the datacenter named dc: it reaches
// that router half a round trip later.
func (f *fed) forward(d *dcState, dc string, idx int, now int64) {
	for _, to := range f.dcs {
		if to.name != dc {
			continue
		}
		if f.cfg.Federation == FedOasis {
			d.spill.Spilled(vtime(now))
		}
		f.forwarded[idx] = true
		f.nFwd++
		f.egress += int64(d.s.reqs[idx].Input) * BytesPerToken
		to.s.push(event{t: now + int64(f.cfg.RTT/2), kind: evForward, idx: int32(idx)})
		return
	}
}

// finished frees a request's admission slot and folds its duration into the
// mean service time, as the gateway's serviceTimes does.
func (f *fed) finished(d *dcState, fl *flight, now int64) {
	d.inflight--
	d.svcMean += (time.Duration(now-fl.arrival) - d.svcMean) / 16
	if err := f.admitWaiting(d, now); err != nil && f.err == nil {
		f.err = err // RunFederated returns it
	}
}

// pushSummary builds d's summary as the gateway's FederationSummary and the
// federation's LocalSummary do, encodes it, and delivers it to every other
// datacenter half a round trip later.
func (f *fed) pushSummary(d *dcState, now int64) {
	m := federation.ModelSummary{Model: d.s.cfg.Model, InFlight: uint32(d.inflight), Queued: uint32(len(d.waiting)),
		Free: federation.FreeUnlimited, TTFT: time.Duration(1<<63 - 1), Prefixes: d.hot.Filter()}
	if c := f.cfg.MaxInFlight; c > 0 {
		m.Free = uint32(max(c-d.inflight, 0))
	}
	for _, w := range d.s.ws {
		m.TTFT = min(m.TTFT, w.Signals().EstimatedTTFT(0))
	}
	_, m.QueueWait = f.pressure(d)
	body, err := (&federation.Summary{DC: d.name, At: vtime(now), Models: []federation.ModelSummary{m}}).MarshalBinary()
	if err != nil {
		panic(err) // one model's summary is far below the size limit
	}
	var got federation.Summary
	if err := got.UnmarshalBinary(body); err != nil {
		panic(err)
	}
	for _, to := range f.dcs {
		if to != d {
			f.sumBytes += int64(len(body))
			to.s.push(event{t: now + int64(f.cfg.RTT/2), kind: evSummaryArrive, sum: &summaryMsg{from: d.i, sum: got.Models[0]}})
		}
	}
}
