package server

import (
	"math"
	"math/rand/v2"
	"strings"

	"github.com/oasis-llm/oasis/internal/tokenizer"
)

// words are what the simulator "generates": common English words, so output reads as
// (meaningless) text and tokenizes like prose.
var words = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his
from at which but have an they you were her she there been one all we their has would when if so no
will more about can said them some could into than its time only other new like these two may first
then do any out also way our most even made after many where through back well much before good great
model cache token block engine prompt request batch memory layer state value result system world`)

// vocab holds each word's tokens with its leading space.
type vocab struct {
	words [][]int32
}

func newVocab() *vocab {
	v := &vocab{}
	for _, w := range words {
		v.words = append(v.words, tokenizer.Encode(nil, " "+w))
	}
	return v
}

// genParams controls one request's generated output.
type genParams struct {
	maxTokens    int // exact count to generate when explicit
	explicitMax  bool
	limit        int // context room left: never generate more
	stop         []string
	stopTokenIDs []int32
	includeStop  bool
	skipSpecial  bool
	topLogprobs  int
	wantLogprobs bool
	fixedLogprob *float64 // every sampled token's log probability, when set
	rng          *rand.Rand
	// greedy, when set, makes each token a function of the context so far
	// (prompt + tokens generated) and of *greedy, the request's seed (0 at
	// temperature 0): a continuation on another server, sent the prompt and
	// the tokens already generated, yields the rest of the same answer.
	greedy *uint64
	prompt []int32 // the context greedy generation starts from
}

// generation is a request's complete, precomputed output. The engine emits tokens
// one per step; the server already knows where text ends and why.
type generation struct {
	tokens       []int32
	text         string // final text (after stop truncation)
	textEnd      []int  // textEnd[i]: bytes of text available after token i
	finishReason string // "length" or "stop"
	stopReason   any    // nil, stop string, or stop token id
	logprobs     []float64
	top          [][]topEntry
}

type topEntry struct {
	token   int32
	logprob float64
}

// generate produces the output. With an explicit max_tokens the request generates
// exactly that many tokens unless a stop condition hits (as with ignore_eos, so load
// tests get the lengths they ask for); without one it ends with an end-of-turn token
// after a length drawn from the request's random source (16–271 tokens), or at the
// context limit.
func (v *vocab) generate(p genParams) *generation {
	n := p.maxTokens
	natural := false
	if !p.explicitMax {
		n = 16 + p.rng.IntN(256)
		natural = true
		if p.greedy != nil {
			n = p.limit // the end of turn comes from the context (continueContext)
		}
	}
	if n > p.limit {
		n, natural = p.limit, false
	}
	g := &generation{tokens: make([]int32, 0, n), finishReason: "length"}
	if p.greedy != nil {
		v.continueContext(g, p, n, natural)
		n, natural = len(g.tokens), false
	}
	for len(g.tokens) < n {
		w := v.words[p.rng.IntN(len(v.words))]
		g.tokens = append(g.tokens, w[:min(len(w), n-len(g.tokens))]...)
	}
	if natural && n > 0 {
		g.tokens[n-1] = tokenizer.EOT
		g.finishReason = "stop"
	}
	// Walk the text for stop strings and stop token ids.
	var text []byte
	g.textEnd = make([]int, 0, n)
	maxStop := 0
	for _, s := range p.stop {
		maxStop = max(maxStop, len(s))
	}
	for i, t := range g.tokens {
		if slicesContains(p.stopTokenIDs, t) {
			g.tokens = g.tokens[:i+1]
			g.finishReason, g.stopReason = "stop", int(t)
			g.textEnd = append(g.textEnd, len(text))
			break
		}
		if !(p.skipSpecial && tokenizer.IsSpecial(t)) {
			text = tokenizer.AppendToken(text, t)
		}
		if len(p.stop) > 0 {
			from := max(0, len(text)-len(tokenizer.TokenBytes(t))-maxStop+1)
			if at, s := findStop(text, from, p.stop); at >= 0 {
				end := at
				if p.includeStop {
					end = at + len(s)
				}
				text = text[:end]
				g.tokens = g.tokens[:i+1]
				g.finishReason, g.stopReason = "stop", s
				g.textEnd = append(g.textEnd, len(text))
				break
			}
		}
		g.textEnd = append(g.textEnd, len(text))
	}
	// Clip earlier offsets to the final text.
	for i := range g.textEnd {
		g.textEnd[i] = min(g.textEnd[i], len(text))
	}
	g.text = string(text)
	if p.wantLogprobs {
		g.logprobs = make([]float64, len(g.tokens))
		g.top = make([][]topEntry, len(g.tokens))
		for i, t := range g.tokens {
			// The chosen token is the most likely one; alternatives are less likely.
			lp := -p.rng.ExpFloat64() * 0.5
			if p.fixedLogprob != nil {
				lp = *p.fixedLogprob
			}
			g.logprobs[i] = round4(lp)
			if p.topLogprobs > 0 {
				ents := make([]topEntry, 0, p.topLogprobs)
				ents = append(ents, topEntry{t, round4(lp)})
				prev := lp
				// 60 distinct first tokens exist and top_logprobs is at most 20, so
				// this ends; the bound only guards against a future smaller vocabulary.
				for tries := 0; len(ents) < p.topLogprobs && tries < 10000; tries++ {
					w := v.words[p.rng.IntN(len(v.words))][0]
					if w == t || containsTok(ents, w) {
						continue
					}
					prev -= 0.5 + p.rng.ExpFloat64()
					ents = append(ents, topEntry{w, round4(prev)})
				}
				g.top[i] = ents
			}
		}
	}
	return g
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

func containsTok(ents []topEntry, t int32) bool {
	for _, e := range ents {
		if e.token == t {
			return true
		}
	}
	return false
}

func slicesContains(s []int32, t int32) bool {
	for _, x := range s {
		if x == t {
			return true
		}
	}
	return false
}

// findStop returns the earliest occurrence at or after from of any stop string.
func findStop(text []byte, from int, stops []string) (int, string) {
	best, which := -1, ""
	for _, s := range stops {
		if s == "" {
			continue
		}
		if i := strings.Index(string(text[from:]), s); i >= 0 && (best < 0 || from+i < best) {
			best, which = from+i, s
		}
	}
	return best, which
}
