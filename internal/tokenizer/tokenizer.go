// Package tokenizer is the stand-in tokenizer and chat template of oasis-sim.
//
// It is deterministic, allocation-light and exactly reversible, so the router, tests
// and the simulator all derive the very same token ids from the same text, and
// Decode(Encode(s)) == s for every string s (special-token spellings included).
//
// Encoding rules:
//
//  1. Special tokens (see the constants below) are recognised wherever their exact
//     spelling (e.g. "<|eot_id|>") appears in the text.
//  2. The remaining text is split into pieces. A piece is a maximal run of bytes of one
//     class — word (ASCII letters, digits, '_' and every byte >= 0x80), punctuation (every
//     other visible byte) or whitespace — where a single ' ' that directly precedes a
//     word or punctuation run is attached to the front of that run (as GPT-style BPE
//     does with "Ġ"). A newline always ends a whitespace piece, so "\n\n" is one piece
//     and "\n  x" gives "\n", " ", " x".
//  3. Each piece is cut into chunks of 3 bytes (the last chunk has 1–3 bytes). A chunk
//     of n bytes b0..b(n-1) becomes the id offset(n) + big-endian value of the bytes,
//     with offset(1)=0, offset(2)=256, offset(3)=256+65536.
//
// So English text averages about 3 characters per token (real BPE vocabularies give
// about 4), and ids are below VocabSize. Decoding a token is O(1) and needs no table.
package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

const (
	offset1 = 0
	offset2 = offset1 + 1<<8
	offset3 = offset2 + 1<<16
	// SpecialBase is the first special-token id.
	SpecialBase = offset3 + 1<<24
)

// Special token ids. Their spellings follow Llama 3's so the rendered chat prompts look
// familiar.
const (
	BOS         int32 = SpecialBase + iota // <|begin_of_text|>
	EOS                                    // <|end_of_text|>
	StartHeader                            // <|start_header_id|>
	EndHeader                              // <|end_header_id|>
	EOT                                    // <|eot_id|>
	numSpecial  = iota
)

// VocabSize is one more than the largest token id.
const VocabSize = SpecialBase + numSpecial

var specialText = [numSpecial]string{
	"<|begin_of_text|>",
	"<|end_of_text|>",
	"<|start_header_id|>",
	"<|end_header_id|>",
	"<|eot_id|>",
}

// IsSpecial reports whether id is a special token.
func IsSpecial(id int32) bool { return id >= SpecialBase && id < VocabSize }

// Valid reports whether id is a token id of this vocabulary.
func Valid(id int32) bool { return id >= 0 && id < VocabSize }

type class uint8

const (
	classSpace class = iota
	classWord
	classPunct
)

func classOf(b byte) class {
	switch {
	case b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\v' || b == '\f':
		return classSpace
	case b >= 0x80, b == '_', b >= '0' && b <= '9', b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z':
		return classWord
	default:
		return classPunct
	}
}

// Encode appends the token ids of text to dst and returns the extended slice. No BOS is
// added; callers that tokenize a completion prompt as vLLM does (add_special_tokens)
// prepend BOS themselves or use EncodePrompt.
func Encode(dst []int32, text string) []int32 {
	for len(text) > 0 {
		i := strings.Index(text, "<|")
		if i < 0 {
			return encodePlain(dst, text)
		}
		dst = encodePlain(dst, text[:i])
		text = text[i:]
		matched := false
		for k, sp := range specialText {
			if strings.HasPrefix(text, sp) {
				dst = append(dst, SpecialBase+int32(k))
				text = text[len(sp):]
				matched = true
				break
			}
		}
		if !matched {
			// "<|" that opens no special token: "<|" is one punctuation run with
			// whatever punctuation follows, so encode up to the next "<|" after it.
			j := strings.Index(text[2:], "<|")
			if j < 0 {
				return encodePlain(dst, text)
			}
			dst = encodePlain(dst, text[:2+j])
			text = text[2+j:]
		}
	}
	return dst
}

// EncodePrompt tokenizes a completion prompt the way vLLM does with
// add_special_tokens=true: BOS followed by Encode(text).
func EncodePrompt(text string) []int32 {
	dst := make([]int32, 0, len(text)/3+2)
	dst = append(dst, BOS)
	return Encode(dst, text)
}

func encodePlain(dst []int32, s string) []int32 {
	for len(s) > 0 {
		n := pieceLen(s)
		p := s[:n]
		for len(p) >= 3 {
			dst = append(dst, offset3+(int32(p[0])<<16|int32(p[1])<<8|int32(p[2])))
			p = p[3:]
		}
		switch len(p) {
		case 2:
			dst = append(dst, offset2+(int32(p[0])<<8|int32(p[1])))
		case 1:
			dst = append(dst, offset1+int32(p[0]))
		}
		s = s[n:]
	}
	return dst
}

// pieceLen returns the length of the first piece of s (len(s) > 0).
func pieceLen(s string) int {
	start := 0
	c := classOf(s[0])
	if s[0] == ' ' && len(s) > 1 && classOf(s[1]) != classSpace {
		start, c = 1, classOf(s[1])
	}
	i := start + 1
	if c == classSpace {
		if s[start] == '\n' {
			// Runs of newlines stay together; anything else ends the piece.
			for i < len(s) && s[i] == '\n' {
				i++
			}
			return i
		}
		for i < len(s) && classOf(s[i]) == classSpace && s[i] != '\n' {
			// Leave a final ' ' for the following word.
			if s[i] == ' ' && i+1 < len(s) && classOf(s[i+1]) != classSpace {
				break
			}
			i++
		}
		return i
	}
	for i < len(s) && classOf(s[i]) == c {
		i++
	}
	return i
}

// TokenBytes returns the bytes token id stands for (the spelling for special tokens);
// nil for an id outside the vocabulary.
func TokenBytes(id int32) []byte {
	switch {
	case id < 0:
		return nil
	case id < offset2:
		return []byte{byte(id)}
	case id < offset3:
		v := id - offset2
		return []byte{byte(v >> 8), byte(v)}
	case id < SpecialBase:
		v := id - offset3
		return []byte{byte(v >> 16), byte(v >> 8), byte(v)}
	case id < VocabSize:
		return []byte(specialText[id-SpecialBase])
	}
	return nil
}

// AppendToken appends the bytes of id to dst; ids outside the vocabulary append nothing.
func AppendToken(dst []byte, id int32) []byte {
	switch {
	case id < 0:
	case id < offset2:
		dst = append(dst, byte(id))
	case id < offset3:
		v := id - offset2
		dst = append(dst, byte(v>>8), byte(v))
	case id < SpecialBase:
		v := id - offset3
		dst = append(dst, byte(v>>16), byte(v>>8), byte(v))
	case id < VocabSize:
		dst = append(dst, specialText[id-SpecialBase]...)
	}
	return dst
}

// Decode returns the text of ids. With skipSpecial, special tokens are left out (vLLM's
// skip_special_tokens). Ids outside the vocabulary decode to nothing; use Valid to
// reject them first.
func Decode(ids []int32, skipSpecial bool) string {
	b := make([]byte, 0, len(ids)*3)
	for _, id := range ids {
		if skipSpecial && IsSpecial(id) {
			continue
		}
		b = AppendToken(b, id)
	}
	return string(b)
}

// TokenString is the display form of one token as vLLM's logprobs show it: its text,
// or "bytes:\xNN..." for a token that is not valid UTF-8 on its own (vLLM's
// return_tokens_as_token_ids=false convention for partial characters).
func TokenString(id int32) string {
	b := TokenBytes(id)
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.WriteString("bytes:")
	for _, c := range b {
		sb.WriteString(`\x`)
		sb.WriteString(strconv.FormatUint(uint64(c)|0x100, 16)[1:])
	}
	return sb.String()
}
