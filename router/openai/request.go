// Package openai reads the fields the router routes by from an OpenAI API
// request body: the model, whether the answer streams, the output token
// budget, whether the client asked for usage, and the prompt.
//
// ParseRequest runs on every request, so it makes one pass over the body
// that both validates it (accepting exactly what json.Valid accepts) and
// notes the raw values of the top-level members it needs, without decoding
// the body into maps. The body itself is forwarded byte for byte; what
// ParseRequest returns points into it.
//
// The package imports only the standard library, so that the gateway, the
// scoring terms and the tokenizers can all share the parsed request.
package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Request is what the router reads of a request body.
type Request struct {
	Model        string
	MaxTokens    int // max_completion_tokens, else max_tokens, when HasMaxTokens
	Stream       bool
	HasMaxTokens bool // either is a non-negative integer
	IncludeUsage bool // stream_options.include_usage is true
	// RouterOwned is true when the body has a top-level member of the
	// router's disaggregation protocol (RouterOwned): the gateway removes
	// them (WithoutRouterOwned) before any engine sees the body. (The
	// booleans sit together: the gateway's per-request exchange, which
	// holds a Request, stays in its 256-byte size class.)
	RouterOwned bool
	Prompt      Prompt
}

// Prompt is the part of a request that determines its prompt tokens: the
// members an engine's chat template or tokenizer reads. Its raw values are
// sub-slices of the body, not copies; callers must not modify them.
type Prompt struct {
	// Chat is true for a chat completions path, whose prompt is Messages;
	// otherwise a completions path's prompt is Prompt, and other endpoints
	// (embeddings) have neither.
	Chat bool
	// Messages is the raw "messages" value of a chat request, nil when
	// absent or null. Its type is not checked: the engine answers a bad one.
	Messages json.RawMessage
	// Prompt is the raw "prompt" value of a completions request, nil when
	// absent or null. Its type is not checked.
	Prompt json.RawMessage
	// AddGenerationPrompt asks the chat template to open the assistant's
	// turn (engines default to true).
	AddGenerationPrompt Flag
	// AddSpecialTokens asks the tokenizer to add the model's special tokens,
	// such as BOS (engines default to true for completions).
	AddSpecialTokens Flag
}

// Flag is an optional boolean member of the body.
type Flag uint8

const (
	FlagUnset   Flag = iota // absent or null: the engine's default applies
	FlagFalse               // false
	FlagTrue                // true
	FlagInvalid             // present but neither a boolean nor null
)

// Or returns the flag's value, or def when it is unset or invalid.
func (f Flag) Or(def bool) bool {
	switch f {
	case FlagTrue:
		return true
	case FlagFalse:
		return false
	}
	return def
}

// flagOf reads a raw member value as a Flag.
func flagOf(raw []byte) Flag {
	switch string(raw) {
	case "", "null":
		return FlagUnset
	case "true":
		return FlagTrue
	case "false":
		return FlagFalse
	}
	return FlagInvalid
}

// ErrMalformedJSON means the body is not valid JSON; the error wrapping it
// also wraps encoding/json's description of the first syntax error.
var ErrMalformedJSON = errors.New("malformed JSON body")

// ErrNotObject means the body is valid JSON but not an object.
var ErrNotObject = errors.New("request body must be a JSON object")

// FieldError is a member the router needs that is missing or of the wrong
// type. Its message is the one the client sees.
type FieldError struct {
	Field   string // the member's key: "model" or "stream"
	Missing bool   // absent or null; otherwise present with a value of the wrong type
	Want    string // what the value must be, e.g. "a boolean"
}

func (e *FieldError) Error() string {
	if e.Missing {
		return "you must provide a " + e.Field + " parameter"
	}
	return e.Field + " must be " + e.Want
}

// ParseRequest reads the routing fields of an OpenAI request body sent to
// path. It fails with ErrMalformedJSON when the body is not valid JSON,
// ErrNotObject when it is not an object, and a *FieldError when model is
// missing or not a non-empty string or stream is not a boolean (or null);
// every other member is the engine's to judge. Keys match exactly, as the
// Python engines match them (encoding/json struct decoding would also accept
// "Model"); a repeated key's last value wins, as in Python's json.
func ParseRequest(path string, body []byte) (Request, error) {
	var r Request
	var raw rawFields
	valid, object := scanRequest(body, &raw)
	if !valid {
		return r, malformed(body)
	}
	if !object {
		return r, ErrNotObject
	}
	if len(raw.model) == 0 || string(raw.model) == "null" {
		return r, &FieldError{Field: "model", Missing: true}
	}
	model, isStr := jsonString(raw.model)
	if !isStr || model == "" {
		return r, &FieldError{Field: "model", Want: "a non-empty string"}
	}
	r.Model = model
	switch string(raw.stream) {
	case "", "null", "false":
	case "true":
		r.Stream = true
	default:
		return r, &FieldError{Field: "stream", Want: "a boolean"}
	}
	r.MaxTokens, r.HasMaxTokens = maxTokens(raw.maxCompl, raw.maxTok)
	r.IncludeUsage = includeUsage(raw.streamOpts)
	r.Prompt = promptOf(path, &raw)
	r.RouterOwned = raw.routerOwned
	return r, nil
}

// malformed names the syntax error of a body scanRequest found invalid.
func malformed(body []byte) error {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformedJSON, err)
	}
	return ErrMalformedJSON
}

// maxTokens returns max_completion_tokens when it is a non-negative integer,
// else max_tokens when that is.
func maxTokens(maxCompl, maxTok []byte) (int, bool) {
	for _, r := range [...][]byte{maxCompl, maxTok} {
		if len(r) == 0 {
			continue // absent: Atoi would allocate its error
		}
		if n, err := strconv.Atoi(string(r)); err == nil && n >= 0 {
			return n, true
		}
	}
	return 0, false
}

// includeUsage reads include_usage from stream_options' raw value.
func includeUsage(streamOpts []byte) bool {
	if len(streamOpts) == 0 || streamOpts[0] != '{' {
		return false
	}
	inc := false
	scanMembers(streamOpts, 0, 2, func(key, val []byte) {
		if string(key) == "include_usage" {
			inc = string(val) == "true"
		}
	})
	return inc
}

// promptOf returns the prompt members the endpoint at path reads.
func promptOf(path string, raw *rawFields) Prompt {
	p := Prompt{
		AddGenerationPrompt: flagOf(raw.addGenPrompt),
		AddSpecialTokens:    flagOf(raw.addSpecial),
	}
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		p.Chat = true
		p.Messages = nonNull(raw.messages)
	case strings.HasSuffix(path, "/completions"):
		p.Prompt = nonNull(raw.prompt)
	}
	return p
}

func nonNull(raw []byte) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}
