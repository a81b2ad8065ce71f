package peers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// Bounds on a peer's message: it comes over the network from whoever holds
// the gossip key.
const (
	maxMessageBytes = 1 << 20
	maxEntries      = 4096
	maxNameBytes    = 512
	// bestEffortBytes is the largest message sent as one UDP packet;
	// larger ones go over TCP (memberlist's reliable send).
	bestEffortBytes = 1200
)

// ErrMessage is a peer's message that does not decode or breaks a bound.
var ErrMessage = errors.New("invalid peer message")

// ModelLoad is one model's admission at one router.
type ModelLoad struct {
	InFlight int `json:"i,omitempty"`
	Queued   int `json:"q,omitempty"`
	// Share is the router's part of the model's cap when it sent this
	// (filled by Peers, not by Config.Local): another router takes none
	// of it until a later message gives it back.
	Share int `json:"s,omitempty"`
	// Band is the highest priority band among the queued requests
	// (admission's bands; meaningful while Queued > 0): the split gives
	// the cap to the routers whose queue holds the highest band waiting
	// anywhere (shareLocked).
	Band int `json:"b,omitempty"`
}

// MaxBand bounds a ModelLoad's Band.
const MaxBand = 1 << 10

// EngineLoad is one router's requests on one engine instance.
type EngineLoad struct {
	InFlight       int64 `json:"i,omitempty"`
	PendingPrefill int64 `json:"p,omitempty"` // uncached prompt tokens without a first token yet
}

// Load is what one router tells the others of itself.
type Load struct {
	// Engines are per worker id (its Consul instance id) the requests this
	// router has on it (workers with none left out).
	Engines map[string]EngineLoad `json:"e,omitempty"`
	// Models are admission's per-model counts (models with a cap only).
	Models map[string]ModelLoad `json:"m,omitempty"`
	// Keys are requests a second per API key id, as the router saw them.
	Keys map[string]float64 `json:"k,omitempty"`
}

// message is a Load on the wire: its router's name and a sequence number
// (a message older than one already applied is dropped).
type message struct {
	Name string `json:"n"`
	Seq  uint64 `json:"s"`
	Load Load   `json:"l"`
	// Prefixes are the router's decisions for event-less engines since
	// its last message (at most MaxPrefixKeys keys).
	Prefixes []Prefix `json:"p,omitempty"`
}

// Encode is the message a router sends its peers: its name, a sequence
// number that grows with each message, its load and its prefix records
// since the last message. It fails past the bound peers accept.
func Encode(name string, seq uint64, l Load, prefixes []Prefix) ([]byte, error) {
	b, err := json.Marshal(message{Name: name, Seq: seq, Load: l, Prefixes: prefixes})
	if err != nil {
		return nil, err
	}
	if len(b) > maxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes, over %d", ErrMessage, len(b), maxMessageBytes)
	}
	return b, nil
}

// decode parses and checks a peer's message; errors wrap ErrMessage and
// name the field at fault.
func decode(b []byte) (message, error) {
	var m message
	if len(b) > maxMessageBytes {
		return m, fmt.Errorf("%w: %d bytes, over %d", ErrMessage, len(b), maxMessageBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: %w", ErrMessage, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return m, fmt.Errorf("%w: data after the message", ErrMessage)
	}
	if m.Name == "" || len(m.Name) > maxNameBytes {
		return m, fmt.Errorf("%w: n: want 1 to %d bytes", ErrMessage, maxNameBytes)
	}
	if len(m.Load.Models)+len(m.Load.Keys)+len(m.Load.Engines) > maxEntries {
		return m, fmt.Errorf("%w: l: over %d entries", ErrMessage, maxEntries)
	}
	for name, ml := range m.Load.Models {
		if name == "" || len(name) > maxNameBytes || ml.InFlight < 0 || ml.Queued < 0 || ml.Share < 0 {
			return m, fmt.Errorf("%w: l.m[%.64q]: empty or long name, or a negative count", ErrMessage, name)
		}
		if ml.Band < 0 || ml.Band > MaxBand {
			return m, fmt.Errorf("%w: l.m[%.64q].b: want 0 to %d, got %d", ErrMessage, name, MaxBand, ml.Band)
		}
	}
	for id, e := range m.Load.Engines {
		if id == "" || len(id) > maxNameBytes || e.InFlight < 0 || e.PendingPrefill < 0 {
			return m, fmt.Errorf("%w: l.e[%.64q]: empty or long id, or a negative count", ErrMessage, id)
		}
	}
	if err := checkPrefixes(m.Prefixes); err != nil {
		return m, err
	}
	for id, r := range m.Load.Keys {
		if id == "" || len(id) > maxNameBytes || r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
			return m, fmt.Errorf("%w: l.k[%.64q]: empty or long id, or a rate not finite and ≥ 0", ErrMessage, id)
		}
	}
	return m, nil
}

// checkPrefixes bounds a message's prefix records: at most maxEntries
// records and MaxPrefixKeys keys in all, each with an engine id and keys.
func checkPrefixes(ps []Prefix) error {
	if len(ps) > maxEntries {
		return fmt.Errorf("%w: p: %d records, over %d", ErrMessage, len(ps), maxEntries)
	}
	keys := 0
	for i, p := range ps {
		if p.Engine == "" || len(p.Engine) > maxNameBytes || len(p.Keys) == 0 {
			return fmt.Errorf("%w: p[%d]: empty or long engine id, or no keys", ErrMessage, i)
		}
		if keys += len(p.Keys); keys > MaxPrefixKeys {
			return fmt.Errorf("%w: p: over %d keys", ErrMessage, MaxPrefixKeys)
		}
	}
	return nil
}
