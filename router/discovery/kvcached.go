package discovery

import (
	"slices"
	"strings"
)

// KVCache is one node-local oasis-kvcached instance as the router follows it:
// its presence events say which prefix blocks the node holds in RAM or on SSD.
type KVCache struct {
	ID             string // service instance id
	Address        string // host:port of its Redis protocol (resolves a wildcard events host)
	Node           string // oasis_node: Nomad node id, joined with the engines' oasis_node
	KVEvents       string // oasis_kv_events: presence events PUB endpoint
	KVEventsReplay string // oasis_kv_events_replay: their replay endpoint, "" if none
}

// KVCachesOf picks the kvcached instances that publish presence events,
// sorted by id. An instance without oasis_kv_events or oasis_node is left
// out: without events there is nothing to learn, and without its node the
// router cannot tell local workers (CPU/disk tier) from remote ones (peer).
func KVCachesOf(instances []Instance) []KVCache {
	out := make([]KVCache, 0, len(instances))
	seen := map[string]bool{}
	for _, in := range instances {
		get := func(k string) string { return strings.TrimSpace(in.Meta[k]) }
		kc := KVCache{ID: in.ID, Address: in.Address, Node: get(MetaNode),
			KVEvents: get(MetaKVEvents), KVEventsReplay: get(MetaKVEventsReplay)}
		if kc.ID == "" || kc.KVEvents == "" || kc.Node == "" || seen[kc.ID] {
			continue
		}
		seen[kc.ID] = true
		out = append(out, kc)
	}
	slices.SortFunc(out, func(a, b KVCache) int { return strings.Compare(a.ID, b.ID) })
	return out
}
