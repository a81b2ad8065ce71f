package provider

import (
	"context"
	"errors"
	"fmt"
	"strings"

	consulapi "github.com/hashicorp/consul/api"
)

// errChanged is a failed check-and-set: someone wrote the key after the
// index the write was based on.
var errChanged = errors.New("changed since the last refresh")

// kvGet reads key; a missing key is (nil, nil).
func kvGet(ctx context.Context, c *consulapi.Client, key string) (*consulapi.KVPair, error) {
	pair, _, err := c.KV().Get(key, (&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("reading %s from Consul KV: %w", key, err)
	}
	return pair, nil
}

// kvCAS writes value to key only while the key's ModifyIndex is still index
// (0: only while the key does not exist), and returns the new ModifyIndex.
// The write and the index come from one transaction, so the index is that
// of this write, not of a later one. A lost race is errChanged.
func kvCAS(ctx context.Context, c *consulapi.Client, key string, value []byte, index uint64) (uint64, error) {
	ops := consulapi.TxnOps{{KV: &consulapi.KVTxnOp{Verb: consulapi.KVCAS, Key: key, Value: value, Index: index}}}
	ok, resp, _, err := c.Txn().Txn(ops, (&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, fmt.Errorf("writing %s to Consul KV: %w", key, err)
	}
	if !ok {
		return 0, fmt.Errorf("writing %s to Consul KV: %w (modify index %d): %s", key, errChanged, index, txnErrors(resp))
	}
	if len(resp.Results) != 1 || resp.Results[0].KV == nil {
		return 0, fmt.Errorf("writing %s to Consul KV: transaction returned no entry", key)
	}
	return resp.Results[0].KV.ModifyIndex, nil
}

// kvDeleteCAS deletes key only while its ModifyIndex is still index. A key
// already gone is not an error.
func kvDeleteCAS(ctx context.Context, c *consulapi.Client, key string, index uint64) error {
	ok, _, err := c.KV().DeleteCAS(&consulapi.KVPair{Key: key, ModifyIndex: index}, (&consulapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("deleting %s from Consul KV: %w", key, err)
	}
	if ok {
		return nil
	}
	pair, err := kvGet(ctx, c, key)
	if err != nil {
		return err
	}
	if pair == nil {
		return nil
	}
	return fmt.Errorf("deleting %s from Consul KV: %w (modify index %d, now %d)", key, errChanged, index, pair.ModifyIndex)
}

func txnErrors(resp *consulapi.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return "check-and-set failed"
	}
	msgs := make([]string, 0, len(resp.Errors))
	for _, e := range resp.Errors {
		msgs = append(msgs, e.What)
	}
	return strings.Join(msgs, "; ")
}
