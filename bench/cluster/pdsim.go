package cluster

import (
	"slices"
	"strconv"
	"time"

	"github.com/oasis-llm/oasis/sim/engine"
)

// promptHashes appends the engine's chained block hashes of prompt's full
// blocks that a prefix hit can cover (never the last token, as the engine).
func promptHashes(dst []uint64, prompt []int32, bs int) []uint64 {
	var parent uint64
	for k := 0; k < (len(prompt)-1)/bs; k++ {
		parent = engine.BlockHash(parent, k > 0, prompt[k*bs:(k+1)*bs])
		dst = append(dst, parent)
	}
	return dst
}

// pickPrefill is the prefill rule, Dynamo's KV router cost with overlap
// weight 1 in tokens: the worker minimising what it still has to prefill
// (its queued uncached prompt tokens plus this prompt's tokens it does not
// cache) plus its active tokens. The first such worker wins a tie. It returns
// the worker and the prompt's uncached tokens there.
func (s *pdSim) pickPrefill(hashes []uint64, input int) (*pdWorker, int64) {
	var best *pdWorker
	var bestCost, bestUnc int64
	for _, w := range s.prefill {
		unc := int64(input - w.eng.CachedPrefixBlocks(hashes)*s.cfg.BlockSize)
		if cost := w.pending + unc + w.active; best == nil || cost < bestCost {
			best, bestCost, bestUnc = w, cost, unc
		}
	}
	return best, bestUnc
}

// pickDecode is the decode rule: the least KV load, the tokens of the
// requests the router has sent the worker that are still in flight (all
// decode workers are the same GPU, so tokens order them as fractions of
// capacity would); then fewer requests in flight; then the first.
func (s *pdSim) pickDecode() *pdWorker {
	best := s.decode[0]
	for _, w := range s.decode[1:] {
		if w.active < best.active || (w.active == best.active && w.inflight < best.inflight) {
			best = w
		}
	}
	return best
}

// arrive routes request idx: the prefill (or only) worker by pickPrefill and,
// when disaggregated, the decode worker by pickDecode, both at arrival as
// llm-d's P/D scheduler does; it submits the prompt with one output token
// (max_tokens 1) to the prefill worker, or the whole request when aggregated.
func (s *pdSim) arrive(idx int, now int64) error {
	r, f := s.reqs[idx], &s.flights[idx]
	f.arrival = now
	f.prompt = r.PromptTokens(make([]int32, 0, r.Input))
	s.hashes = promptHashes(s.hashes[:0], f.prompt, s.cfg.BlockSize)
	p, unc := s.pickPrefill(s.hashes, r.Input)
	f.p, f.d, f.uncached = p.idx, p.idx, unc
	p.pending += unc
	p.inflight++
	out := outputTokens(idx, r.Output)
	if s.decode == nil {
		p.active += int64(r.Input + r.Output)
		return s.submit(p, &engine.Request{ID: strconv.Itoa(idx), Prompt: f.prompt, Output: out}, now)
	}
	d := s.pickDecode()
	f.d = d.idx
	p.active += int64(r.Input)
	d.active += int64(r.Input + r.Output)
	d.inflight++
	return s.submit(p, &engine.Request{ID: strconv.Itoa(idx), Prompt: f.prompt, Output: out[:1]}, now)
}

func (s *pdSim) submit(w *pdWorker, req *engine.Request, now int64) error {
	if err := w.eng.Submit(req); err != nil {
		return err
	}
	if req.RemotePrefill {
		w.remote++
	}
	if !w.busy {
		s.startStep(w, now)
	}
	return nil
}

func (s *pdSim) startStep(w *pdWorker, now int64) {
	res := w.eng.Step()
	if res.Duration == 0 {
		w.busy = false
		return
	}
	w.busy = true
	w.promptComputed += int64(res.PrefillTokens)
	w.generated += int64(len(res.Outputs))
	w.outs = append(w.outs[:0], res.Outputs...)
	s.q.push(event{t: now + int64(res.Duration), kind: evStepDone, w: w.idx})
}

func (s *pdSim) stepDone(w *pdWorker, now int64) {
	for _, o := range w.outs {
		idx, _ := strconv.Atoi(o.ID)
		if w.role == rolePrefill {
			s.prefilled(w, idx, o, now)
		} else {
			s.token(w, idx, o, now)
		}
	}
	if w.eng.HasWork() {
		s.startStep(w, now)
	} else {
		w.busy = false
	}
}

// transferTime is how long a prompt's KV takes over one link.
func (c PDConfig) transferTime(tokens int) int64 {
	return int64(float64(int64(tokens)*c.KV.BytesPerToken()) / (c.LinkGBps * 1e9) * 1e9)
}

// prefilled ends request idx's prefill on w and starts its KV transfer: the
// whole prompt's KV, once both the prefill GPU's NIC (sending) and the decode
// GPU's (receiving) are free, at LinkGBps. Each NIC carries one transfer at a
// time, in order.
func (s *pdSim) prefilled(w *pdWorker, idx int, o engine.Output, now int64) {
	r, f := s.reqs[idx], &s.flights[idx]
	w.pending -= f.uncached
	w.active -= int64(r.Input)
	w.inflight--
	s.cached += int64(o.CachedTokens)
	s.promptTok += int64(r.Input)
	d := s.workers[f.d]
	start := max(now, w.txFree, d.rxFree)
	end := start + s.cfg.transferTime(r.Input)
	w.txFree, d.rxFree = end, end
	s.xfers = append(s.xfers, float64(end-now)/1e9)
	s.xferBytes += float64(int64(r.Input) * s.cfg.KV.BytesPerToken())
	s.q.push(event{t: end, kind: evTransfer, idx: int32(idx)})
}

// transferred submits request idx to its decode worker with RemotePrefill:
// the engine counts the prompt as computed and computes only its last token.
func (s *pdSim) transferred(idx int, now int64) error {
	r, f := s.reqs[idx], &s.flights[idx]
	req := &engine.Request{ID: strconv.Itoa(idx), Prompt: f.prompt, Output: outputTokens(idx, r.Output), RemotePrefill: true}
	return s.submit(s.workers[f.d], req, now)
}

// token records an output token of request idx on w (aggregated or decode).
func (s *pdSim) token(w *pdWorker, idx int, o engine.Output, now int64) {
	r, f := s.reqs[idx], &s.flights[idx]
	if o.Index == 0 {
		f.first = now
		s.ttfts = append(s.ttfts, float64(now-f.arrival)/1e9)
		if w.role == roleBoth {
			w.pending -= f.uncached
			s.cached += int64(o.CachedTokens)
			s.promptTok += int64(r.Input)
		}
	}
	f.last = now
	f.tokens++
	if !o.Finished {
		return
	}
	f.done++
	f.prompt = nil
	w.active -= int64(r.Input + r.Output)
	w.inflight--
	s.completed++
	s.lastDone = now
	l := reqLatency{ttft: time.Duration(f.first - f.arrival), tpot: -1}
	if r.Output > 1 {
		l.tpot = time.Duration((f.last - f.first) / int64(r.Output-1))
		s.tpots = append(s.tpots, l.tpot.Seconds())
	}
	s.lat = append(s.lat, l)
}

// judge is the run's outcome under o over span seconds of trace time.
func (s *pdSim) judge(o SLO, span float64) SLOResult {
	met := 0
	for _, l := range s.lat {
		if l.ttft <= o.TTFT && l.tpot <= o.TPOT {
			met++
		}
	}
	res := SLOResult{TTFT: o.TTFT.Seconds(), TPOT: o.TPOT.Seconds()}
	if len(s.reqs) > 0 {
		res.Attainment = float64(met) / float64(len(s.reqs))
	}
	if span > 0 {
		res.Goodput = float64(met) / span
	}
	return res
}

func (s *pdSim) result(wall time.Duration) PDResult {
	c := s.cfg
	r := PDResult{Split: c.Split(), Prefill: c.Prefill, Decode: c.Workers - c.Prefill, RateScale: c.RateScale,
		Requests: len(s.reqs), Completed: s.completed, WallSeconds: wall.Seconds(), XferBytes: s.xferBytes}
	if c.Prefill == 0 {
		r.Decode = 0
	}
	span := Span(s.reqs) / c.RateScale
	if span > 0 {
		r.Rate = float64(len(s.reqs)) / span
	}
	for _, o := range c.SLOs {
		r.SLO = append(r.SLO, s.judge(o, span))
	}
	r.Makespan = float64(s.lastDone) / 1e9
	if r.Makespan > 0 {
		r.Throughput = float64(s.completed) / r.Makespan
	}
	if s.promptTok > 0 {
		r.HitRatio = float64(s.cached) / float64(s.promptTok)
	}
	p := func(v []float64, q float64) float64 {
		if len(v) == 0 {
			return 0
		}
		return percentile(v, q)
	}
	for _, v := range [][]float64{s.ttfts, s.tpots, s.xfers} {
		slices.Sort(v)
	}
	r.TTFTP50, r.TTFTP90, r.TTFTP99 = p(s.ttfts, 0.5), p(s.ttfts, 0.9), p(s.ttfts, 0.99)
	r.TPOTP50, r.TPOTP90, r.TPOTP99 = p(s.tpots, 0.5), p(s.tpots, 0.9), p(s.tpots, 0.99)
	r.XferP50, r.XferP90 = p(s.xfers, 0.5), p(s.xfers, 0.9)
	for _, w := range s.workers {
		r.Preemptions += w.eng.Stats().Preemptions
		if w.role == roleDecode {
			r.DecodeRecompute += w.promptComputed - int64(w.remote)
		}
	}
	return r
}
