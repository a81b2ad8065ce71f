package server

import (
	"slices"

	"github.com/oasis-llm/oasis/internal/tokenizer"
)

// Greedy generation: at temperature 0 or with a seed, each next token is a
// function of the context so far (prompt + tokens generated) and the seed,
// as a real engine's greedy decoding is. A continuation sent to another
// server (the prompt plus the tokens one server already generated, as the
// router does when it migrates a stream) then yields exactly the rest of the
// uninterrupted answer.
//
// Text stays a run of vocabulary words although a word is several tokens:
// the word starting at a word-start token (one beginning with a space) is
// chosen by the hash of the context before it, so the tokens after it
// follow from that hash too, wherever the context was cut.

// eotOdds is the chance, one in eotOdds, that a word start without an
// explicit max_tokens is the end of turn instead: about 2 tokens a word,
// answers average ~200 tokens, as the unseeded 16–271 do.
const eotOdds = 100

// maxWordTokens bounds the tokens of one vocabulary word (a prefix longer
// than any word is not a word in progress).
const maxWordTokens = 8

// greedyContext is the state next needs: the hash of the whole context, the
// hash before its last word-start token, and the tokens since.
type greedyContext struct {
	seed      uint64
	h         uint64 // FNV-1a over every token of the context
	wordStart uint64 // h before the last word-start token
	partial   []int32
	inWord    bool // the context has a word start and partial is bounded
	scratch   []byte
}

func newGreedyContext(seed uint64, prompt []int32) *greedyContext {
	c := &greedyContext{seed: seed, h: 1469598103934665603, partial: make([]int32, 0, maxWordTokens),
		scratch: make([]byte, 0, 32)}
	for _, t := range prompt {
		c.push(t)
	}
	return c
}

// push appends t to the context.
func (c *greedyContext) push(t int32) {
	c.scratch = tokenizer.AppendToken(c.scratch[:0], t)
	if len(c.scratch) > 0 && c.scratch[0] == ' ' && !tokenizer.IsSpecial(t) {
		c.wordStart, c.partial, c.inWord = c.h, c.partial[:0], true
	}
	if len(c.partial) < maxWordTokens {
		c.partial = append(c.partial, t)
	} else {
		c.inWord = false
	}
	c.h = (c.h ^ uint64(uint32(t))) * 1099511628211
}

// pick chooses a word from a context hash.
func (v *vocab) pick(h, seed uint64) []int32 {
	x := h ^ (seed+1)*0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return v.words[x%uint64(len(v.words))]
}

// next is the context's next token: the rest of the word in progress, else
// the first token of the word the context's hash picks, or (eot) the end
// of turn.
func (v *vocab) next(c *greedyContext, eot bool) int32 {
	if c.inWord {
		w := v.pick(c.wordStart, c.seed)
		if len(c.partial) < len(w) && slices.Equal(c.partial, w[:len(c.partial)]) {
			return w[len(c.partial)]
		}
	}
	if eot && (c.h^c.seed)%eotOdds == 0 {
		return tokenizer.EOT
	}
	return v.pick(c.h, c.seed)[0]
}

// continueContext generates up to n tokens into g greedily; natural: an
// end of turn may end it first.
func (v *vocab) continueContext(g *generation, p genParams, n int, natural bool) {
	c := newGreedyContext(*p.greedy, p.prompt)
	for len(g.tokens) < n {
		t := v.next(c, natural)
		g.tokens = append(g.tokens, t)
		if t == tokenizer.EOT {
			g.finishReason = "stop"
			break
		}
		c.push(t)
	}
}
