package gateway

import (
	"bytes"
	"encoding/json"
)

// usageScanner picks the engine's usage object out of a response as it
// streams by, with bounded memory: for SSE it looks at complete "data:" lines
// that mention "usage"; for a JSON body it keeps up to 1 MiB and parses at the end,
// and of a longer one its last 64 KiB, where its usage member is looked for.
type usageScanner struct {
	sse    bool
	line   []byte
	body   []byte
	over   bool
	prompt int64
	compl  int64
	found  bool
}

const (
	maxUsageBuf  = 1 << 20  // a JSON answer parsed whole
	maxUsageTail = 64 << 10 // the tail of a longer one searched for its usage
)

type usageDoc struct {
	Usage *usageCounts `json:"usage"`
	// Response is a Responses API stream event's response object, whose
	// usage the response.completed event carries.
	Response *struct {
		Usage *usageCounts `json:"usage"`
	} `json:"response"`
}

// usageCounts is a usage object: chat/completions name its counts
// prompt_tokens and completion_tokens, the Responses API input_tokens and
// output_tokens.
type usageCounts struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
}

func (c *usageCounts) counts() (prompt, completion int64) {
	return c.PromptTokens + c.InputTokens, c.CompletionTokens + c.OutputTokens
}

func (u *usageScanner) feed(p []byte) {
	if !u.sse {
		u.body = append(u.body, p...)
		if len(u.body) > maxUsageBuf {
			// Over 1 MiB: keep its tail, where usage follows the choices.
			u.over = true
			u.body = append(u.body[:0], u.body[len(u.body)-maxUsageTail:]...)
		}
		return
	}
	// Fast path: whole lines without a usage object (almost every event).
	if len(u.line) == 0 && len(p) > 0 && p[len(p)-1] == '\n' && !mentionsUsage(p) {
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(u.line)+len(p) <= maxUsageBuf {
				u.line = append(u.line, p...)
			}
			return
		}
		u.line = append(u.line, p[:i]...)
		u.sseLine(u.line)
		u.line = u.line[:0]
		p = p[i+1:]
	}
}

func (u *usageScanner) sseLine(l []byte) {
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if !ok || !mentionsUsage(data) {
		return
	}
	u.parse(bytes.TrimSpace(data))
}

func (u *usageScanner) parse(b []byte) {
	var d usageDoc
	if json.Unmarshal(b, &d) != nil {
		return
	}
	if d.Usage == nil && d.Response != nil {
		d.Usage = d.Response.Usage
	}
	if d.Usage != nil {
		u.prompt, u.compl = d.Usage.counts()
		u.found = true
	}
}

func (u *usageScanner) result() (prompt, completion int64, ok bool) {
	switch {
	case u.sse || len(u.body) == 0:
	case !u.over:
		u.parse(u.body)
	default:
		u.parseTail()
	}
	return u.prompt, u.compl, u.found
}

// parseTail reads the last "usage" member of a long JSON answer's tail.
func (u *usageScanner) parseTail() {
	i := bytes.LastIndex(u.body, []byte(`"usage"`))
	if i < 0 {
		return
	}
	rest := bytes.TrimLeft(u.body[i+len(`"usage"`):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return
	}
	var d usageDoc
	if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&d.Usage) == nil && d.Usage != nil {
		u.prompt, u.compl = d.Usage.counts()
		u.found = true
	}
}

// mentionsUsage is bytes.Contains(p, []byte(`"usage"`)), about ten times
// faster on SSE events: bytes.Index stops at every '"' of the event (tens
// of them), this only at its few 'g's.
func mentionsUsage(p []byte) bool {
	const key = `"usage"`
	for off := 0; ; {
		i := bytes.IndexByte(p[off:], 'g')
		if i < 0 {
			return false
		}
		g := off + i // key[4] == 'g'
		if g >= 4 && len(p)-g >= 3 && string(p[g-4:g+3]) == key {
			return true
		}
		off = g + 1
	}
}
