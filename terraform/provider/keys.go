package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oasis-llm/oasis/internal/ctxsleep"
	"github.com/oasis-llm/oasis/router/auth"
)

// keysKeySuffix is the key document's key below the router's -kv-prefix.
const keysKeySuffix = "/keys"

// keysAttempts bounds the read-modify-write retries of one change to the
// key document: every oasis_api_key shares it, and tofu applies them in
// parallel.
const keysAttempts = 20

// errUnchanged from a change to the key document: nothing to write.
var errUnchanged = errors.New("unchanged")

func (c *Clients) keysKey() string { return c.KVPrefix + keysKeySuffix }

// readKeys reads the key document and its ModifyIndex (0 and no keys when
// there is none). A document the router would refuse is an error: writing
// over it could drop what it holds.
func (c *Clients) readKeys(ctx context.Context) (*auth.File, uint64, error) {
	key := c.keysKey()
	pair, err := kvGet(ctx, c.Consul, key)
	if err != nil || pair == nil {
		return &auth.File{}, 0, err
	}
	if _, err := auth.Parse(pair.Value); err != nil {
		return nil, 0, fmt.Errorf("the key document %s is invalid (the router refuses it too): %w", key, err)
	}
	var f auth.File
	if err := json.Unmarshal(pair.Value, &f); err != nil {
		return nil, 0, fmt.Errorf("decoding %s: %w", key, err)
	}
	return &f, pair.ModifyIndex, nil
}

// updateKeys applies change to the key document: read, change, validate
// with the router's auth.Parse, write with check-and-set on the index read,
// and start over when another writer came first. A change that returns
// errUnchanged writes nothing. A change that leaves no key deletes the
// document (check-and-set too): the router treats a missing document as no
// keys, refusing every request, so destroying the last key leaves nothing
// in Consul and the same behaviour.
func (c *Clients) updateKeys(ctx context.Context, change func(*auth.File) error) error {
	key := c.keysKey()
	for attempt := 1; ; attempt++ {
		f, index, err := c.readKeys(ctx)
		if err != nil {
			return err
		}
		err = change(f)
		if errors.Is(err, errUnchanged) {
			return nil
		}
		if err != nil {
			return err
		}
		err = c.writeKeys(ctx, f, index)
		if !errors.Is(err, errChanged) {
			return err
		}
		if attempt == keysAttempts {
			return fmt.Errorf("%w (%d attempts)", err, attempt)
		}
		if err := ctxsleep.Sleep(ctx, time.Duration(5+rand.IntN(20*attempt))*time.Millisecond); err != nil {
			return fmt.Errorf("updating %s: %w", key, err)
		}
	}
}

// writeKeys writes f over the document at index, or deletes the document
// when f holds no key.
func (c *Clients) writeKeys(ctx context.Context, f *auth.File, index uint64) error {
	key := c.keysKey()
	if len(f.Keys) == 0 {
		if index == 0 {
			return nil
		}
		return kvDeleteCAS(ctx, c.Consul, key, index)
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", key, err)
	}
	if _, err := auth.Parse(data); err != nil {
		return fmt.Errorf("the key document %s would be invalid: %w", key, err)
	}
	_, err = kvCAS(ctx, c.Consul, key, data, index)
	return err
}

// findKey is the index of id's entry in f, -1 if none.
func findKey(f *auth.File, id string) int {
	for i, k := range f.Keys {
		if k.ID == id {
			return i
		}
	}
	return -1
}
