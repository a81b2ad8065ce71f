package scoring

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/shoenig/test/must"
)

// learn teaches w's prefill rate: one sample of tokens in d with nothing ahead.
func learn(w *Worker, tokens int64, d time.Duration) {
	w.Live.StartPrefill(tokens).FirstToken(d)
}

func TestPrefillRateLearning(t *testing.T) {
	cases := []struct {
		name    string
		samples [][2]int64 // tokens, milliseconds; each sent alone
		want    float64
	}{
		{"unmeasured uses the default", nil, DefaultPrefillRate},
		{"one long prompt", [][2]int64{{20000, 1000}}, 20000},
		{"short prompts teach nothing", [][2]int64{{MinPrefillSample - 1, 1000}, {16, 500}}, DefaultPrefillRate},
		{"ratio of sums weighs long prompts",
			// decayed: (0.9·4000 + 20000) / (0.9·1 + 1) s
			[][2]int64{{4000, 1000}, {20000, 1000}}, (0.9*4000 + 20000) / 1.9},
		{"zero time is ignored", [][2]int64{{4000, 0}}, DefaultPrefillRate},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := &Worker{ID: "a", Live: NewLive()}
			for _, s := range tc.samples {
				learn(w, s[0], time.Duration(s[1])*time.Millisecond)
			}
			s := w.Signals()
			must.Eq(t, int64(0), s.PendingPrefillTokens)
			if math.Abs(s.PrefillRate-tc.want) > 1e-6 {
				t.Fatalf("rate: want %v, got %v", tc.want, s.PrefillRate)
			}
		})
	}
}

// A first token that waited behind other prompts teaches the rate for the
// whole queue it waited for, so the estimate matches what it predicts: queued
// plus own tokens over the rate.
func TestPrefillQueueAndSample(t *testing.T) {
	w := &Worker{ID: "a", Live: NewLive()}
	first := w.Live.StartPrefill(6000)
	second := w.Live.StartPrefill(2000)
	must.Eq(t, int64(8000), w.Signals().PendingPrefillTokens)

	first.FirstToken(500 * time.Millisecond) // 6000 tokens in 0.5 s
	must.Eq(t, int64(2000), w.Signals().PendingPrefillTokens)
	must.Eq(t, 12000.0, w.Signals().PrefillRate)

	second.FirstToken(time.Second) // it waited for 6000 + 2000 tokens
	must.Eq(t, int64(0), w.Signals().PendingPrefillTokens)
	must.Eq(t, (0.9*6000+8000)/(0.9*0.5+1), w.Signals().PrefillRate)

	// Ending twice, or cancelling after the first token, changes nothing.
	second.FirstToken(time.Millisecond)
	second.Cancel()
	must.Eq(t, int64(0), w.Signals().PendingPrefillTokens)
	must.Eq(t, (0.9*6000+8000)/(0.9*0.5+1), w.Signals().PrefillRate)

	// Cancel drops the tokens without a sample; negative counts are zero.
	w.Live.StartPrefill(5000).Cancel()
	w.Live.StartPrefill(-3).FirstToken(time.Second)
	must.Eq(t, int64(0), w.Signals().PendingPrefillTokens)
	must.Eq(t, (0.9*6000+8000)/(0.9*0.5+1), w.Signals().PrefillRate)

	var none *Prefill // a request the gateway did not track
	none.FirstToken(time.Second)
	none.Cancel()
}

func TestEstimatedTTFT(t *testing.T) {
	cases := []struct {
		name     string
		s        Signals
		uncached int64
		want     time.Duration
	}{
		{"idle", Signals{PrefillRate: 10000}, 5000, 500 * time.Millisecond},
		{"queued ahead", Signals{PrefillRate: 10000, PendingPrefillTokens: 15000}, 5000, 2 * time.Second},
		{"fully cached, idle", Signals{PrefillRate: 10000}, 0, 0},
		{"unknown rate uses the default", Signals{}, DefaultPrefillRate, time.Second},
		{"negative inputs count as zero", Signals{PrefillRate: 1000, PendingPrefillTokens: -5}, -5, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { must.Eq(t, tc.want, tc.s.EstimatedTTFT(tc.uncached)) })
	}
}

func TestTTFTTerm(t *testing.T) {
	const tau = 0.25    // DefaultTTFTScale in seconds
	p := prompt(1, 100) // 400 tokens
	type setup struct {
		rate    float64 // tokens/s to teach (0: leave the default)
		pending int64
		cached  int // prompt blocks in its cache
	}
	cases := []struct {
		name      string
		recompute float64 // κ
		ws        []setup
		want      []float64
	}{
		{"equal workers tie", DefaultRecompute, []setup{{}, {}}, []float64{1, 1}},
		{"slow GPU scores lower", DefaultRecompute,
			[]setup{{rate: 4000}, {rate: 1000}},
			// est 0.1 s and 0.4 s
			[]float64{1, (tau + 0.1) / (tau + 0.4)}},
		{"a queue ahead counts", DefaultRecompute,
			[]setup{{rate: 4000, pending: 4000}, {rate: 2000}},
			// est (4000+400)/4000 = 1.1 s and 400/2000 = 0.2 s
			[]float64{(tau + 0.2) / (tau + 1.1), 1}},
		{"cached prefix is not computed", 0,
			[]setup{{rate: 1000, cached: 75}, {rate: 4000}},
			// uncached 100 and 400 tokens: est 0.1 s each
			[]float64{1, 1}},
		{"recomputing what another holds is charged", 1,
			[]setup{{rate: 1000, cached: 75}, {rate: 4000}},
			// b recomputes the 300 tokens a holds: est 0.1 s and (400+300)/4000 = 0.175 s
			[]float64{1, (tau + 0.1) / (tau + 0.175)}},
		{"κ NaN charges nothing", math.NaN(),
			[]setup{{rate: 1000, cached: 75}, {rate: 4000}},
			[]float64{1, 1}},
		{"charge scales with κ", 2,
			[]setup{{rate: 1000, cached: 75}, {rate: 4000}},
			// (400+2·300)/4000 = 0.25 s
			[]float64{1, (tau + 0.1) / (tau + 0.25)}},
		{"only against the best holder", 1,
			[]setup{{rate: 1000, cached: 75}, {rate: 1000, cached: 50}, {rate: 1000}},
			// uncached 100, 200, 400 tokens; charged 100, 200+100, 400+300
			[]float64{1, (tau + 0.1) / (tau + 0.3), (tau + 0.1) / (tau + 0.7)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids := []string{"a", "b", "c"}[:len(tc.ws)]
			s := newPrefixState(t, ids...)
			var ws []*Worker
			for i, su := range tc.ws {
				w := bsWorker(ids[i], 0)
				if su.rate > 0 {
					learn(w, 10000, time.Duration(10000/su.rate*float64(time.Second)))
				}
				if su.pending > 0 {
					w.Live.StartPrefill(su.pending)
				}
				if su.cached > 0 {
					hold(t, s, ids[i], p[:su.cached*testBS])
				}
				ws = append(ws, w)
			}
			out := make([]float64, len(ws))
			term := NewTTFTTerm(NewPrefixTerm(s))
			term.Recompute = tc.recompute
			term.Score(context.Background(), tokReq(p), ws, out)
			approx(t, tc.want, out)
		})
	}
}

// A session's holder with prefill queued keeps the session against an idle
// worker of the same speed while its queue is shorter than (1+κ) times the
// context the idle worker would recompute; without the charge (κ = 0) the
// idle worker wins once the holder's queue is longer than that context.
func TestTTFTTermKeepsSessionOnHolder(t *testing.T) {
	p := prompt(1, 1000) // 4,000 tokens: a 3,800-token context and a 200-token new turn
	cases := []struct {
		name      string
		recompute float64
		pending   int64 // on the holder
		holder    bool  // whether the holder wins
	}{
		// est: holder (pending + 200) / 10,000 tokens/s; idle (4,000 + κ·3,800) / 10,000.
		{"myopic: a queue longer than the context loses the session", 0, 5000, false},
		{"charged: the same queue keeps it", 1, 5000, true},
		{"charged: a queue past the charge moves it", 1, 8000, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newPrefixState(t, "holder", "idle")
			hold(t, s, "holder", p[:950*testBS])
			ws := []*Worker{bsWorker("holder", 0), bsWorker("idle", 0)}
			for _, w := range ws {
				learn(w, 10000, time.Second) // 10,000 tokens/s each
			}
			ws[0].Live.StartPrefill(tc.pending)
			out := make([]float64, 2)
			term := NewTTFTTerm(NewPrefixTerm(s))
			term.Recompute = tc.recompute
			term.Score(context.Background(), tokReq(p), ws, out)
			must.Eq(t, tc.holder, out[0] > out[1], must.Sprintf("scores holder %v, idle %v", out[0], out[1]))
		})
	}
}

func TestTTFTTermWithoutTokensIsNeutral(t *testing.T) {
	ws := []*Worker{bsWorker("a", 0), bsWorker("b", 0)}
	out := make([]float64, 2)
	NewTTFTTerm(nil).Score(context.Background(), &Request{Model: "m"}, ws, out)
	approx(t, []float64{Neutral, Neutral}, out)

	// Without a prefix match the whole prompt counts as uncached; an
	// unmeasured worker (a) is assumed fast, so it is tried.
	learn(ws[1], 10000, 4*time.Second) // 2500 tokens/s
	NewTTFTTerm(nil).Score(context.Background(), tokReq(prompt(1, 250)), ws, out)
	approx(t, []float64{1, (0.25 + 1000.0/DefaultPrefillRate) / (0.25 + 0.4)}, out)
}

// The prefix and ttft terms share one match per request, whichever runs
// first, and the router can read the uncached tokens of its pick afterwards.
func TestPrefixMatchIsSharedAndUncachedTokens(t *testing.T) {
	s := newPrefixState(t, "a", "b")
	p := prompt(1, 8)
	hold(t, s, "a", p[:3*testBS])
	prefix := NewPrefixTerm(s)
	ws := []*Worker{bsWorker("a", 0), bsWorker("b", 0)}

	req := tokReq(p)
	_, ok := req.UncachedTokens(ws[0])
	must.False(t, ok, must.Sprint("not tokenized yet"))
	NewTTFTTerm(prefix).Score(context.Background(), req, ws, make([]float64, 2))
	n, ok := req.UncachedTokens(ws[0])
	must.True(t, ok)
	must.Eq(t, int64(5*testBS), n)
	n, _ = req.UncachedTokens(ws[1])
	must.Eq(t, int64(8*testBS), n)

	// The prefix term reuses the match: blocks recorded after it was taken
	// do not show up for this request.
	hold(t, s, "b", p)
	out := make([]float64, 2)
	prefix.Score(context.Background(), req, ws, out)
	approx(t, []float64{3.0 / 8, 0}, out)
	_, matched, ok := req.PrefixResult("a")
	must.True(t, ok)
	must.Eq(t, 3, matched)
}

// fixedSource matches every prompt as its matches say (one key per block).
type fixedSource []prefixindex.Match

func (fixedSource) Keys(dst []uint64, _ string, bs int, tokens []uint32) ([]uint64, error) {
	for i := 0; i < len(tokens)/bs; i++ {
		dst = append(dst, uint64(i+1))
	}
	return dst, nil
}

func (f fixedSource) Match(_ []uint64, _ prefixindex.TierWeights, out []prefixindex.Match) []prefixindex.Match {
	return append(out, f...)
}

// The recompute charge tells a holder whose copy an engine confirmed from
// one whose copy is only in flight: a worker that would recompute the
// holder's prefix is charged κ for confirmed blocks and κ_f for blocks
// only in flight, and nothing beyond its own estimate with κ_f = 0.
func TestTTFTTermChargesInflightCopiesLess(t *testing.T) {
	const blocks, held = 1000, 950 // 4,000 tokens; the holder has 3,800 of them
	const kappa, kappaF = DefaultRecompute, DefaultInflightRecompute
	cases := []struct {
		name      string
		inflight  int // of the holder's 950 blocks, those only in flight
		kappaF    float64
		wantOther float64 // the other worker's charged tokens
	}{
		{"confirmed: κ", 0, kappaF, 4000 + kappa*3800},
		{"in flight only: κ_f", held, kappaF, 4000 + kappaF*3800},
		{"in flight only, κ_f 0: no charge", held, 0, 4000},
		{"partly confirmed: κ and κ_f", 200, kappaF, 4000 + kappa*3000 + kappaF*800},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := fixedSource{{Worker: "holder", Blocks: held, Weighted: held, GPUBlocks: held, Inflight: tc.inflight}}
			ws := []*Worker{bsWorker("holder", 0), bsWorker("other", 0)}
			term := NewTTFTTerm(NewPrefixTerm(src))
			must.Eq(t, DefaultRecompute, term.Recompute)
			must.Less(t, term.Recompute, kappaF)
			term.InflightRecompute = tc.kappaF
			req := tokReq(prompt(1, blocks))
			_, err := req.PromptTokens(context.Background())
			must.NoError(t, err)
			must.True(t, term.Prefix.match(context.Background(), req, ws))
			out := make([]float64, 2)
			term.chargedTokens(req, ws, out)
			approx(t, []float64{(blocks - held) * testBS, tc.wantOther}, out)
		})
	}
}
