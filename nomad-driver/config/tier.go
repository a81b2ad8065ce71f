package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A KV offload tier is declared once per cluster by the platform team, as
// the Nomad variable TierVariablePath(name), and referenced by tasks as
// kv_offload_tier = "<name>". The driver reads the declaration (and the
// secret it references) with the task's own workload identity when the task
// starts, so Nomad's ACLs decide which jobs may use which tier, and a
// changed declaration reaches new allocations only.

// Tier kinds.
const (
	TierKVCached       = "kvcached"        // the node-local oasis-kvcached, through LMCache's redis:// remote
	TierLMCacheServer  = "lmcache-server"  // an LMCache server, LMCache's lm:// remote
	TierMooncake       = "mooncake"        // a Mooncake store: SGLang HiCache's mooncake backend
	TierNIXL           = "nixl"            // a NIXL storage agent (declared and validated; refused at render, see nixlNotRendered)
	TierHiCacheStorage = "hicache-storage" // SGLang HiCache's storage tier (--hicache-storage-backend)
	TierSharedFS       = "shared-fs"       // a directory on a filesystem every node mounts
)

// TierKinds lists the kinds a declaration may name.
var TierKinds = []string{TierKVCached, TierLMCacheServer, TierMooncake, TierNIXL, TierHiCacheStorage, TierSharedFS}

// TierPrefix is where tier declarations live in Nomad variables.
const TierPrefix = "oasis/tiers/"

// TierVariablePath is the Nomad variable that declares tier name.
func TierVariablePath(name string) string { return TierPrefix + name }

// NodeIPPlaceholder in a tier's address is replaced by the node's address
// (the host IP of the task's API port) when a task starts.
const NodeIPPlaceholder = "${node.ip}"

// DefaultSecretItem is the item of the secret variable read when the
// declaration names none.
const DefaultSecretItem = "password"

var (
	tierNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	// varPathRE is what Nomad accepts as a variable path (letters, digits
	// and -_~/ and '.'), without empty segments.
	varPathRE = regexp.MustCompile(`^[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*$`)
)

// Tier is one parsed and validated tier declaration.
type Tier struct {
	Name string
	Kind string
	// Address is host:port, possibly with NodeIPPlaceholder as host.
	Address string
	// SizeGB is the CPU tier in front of the remote store (LMCache's
	// max_local_cpu_size) or, for SGLang, HiCache's host memory
	// (--hicache-size); 0: none / the engine's default.
	SizeGB float64
	// Path is shared-fs's directory.
	Path string
	// Backend is hicache-storage's --hicache-storage-backend.
	Backend string
	// Protocol and MetadataServer are a mooncake tier's transfer protocol
	// (MOONCAKE_PROTOCOL) and transfer-engine metadata server
	// (MOONCAKE_TE_META_DATA_SERVER); empty: Mooncake's defaults.
	Protocol, MetadataServer string
	// SecretPath and SecretItem name the Nomad variable item holding the
	// store's password; empty SecretPath: no password.
	SecretPath, SecretItem string
	// Secret is the password read from SecretPath when the task starts; it
	// is never part of the declaration.
	Secret string
}

// tierItems are the items a declaration may hold.
var tierItems = []string{"kind", "address", "size_gb", "path", "backend", "protocol", "metadata_server", "secret_path", "secret_item", "auth"}

// MooncakeProtocols are Mooncake's transfer protocols a mooncake tier may name.
var MooncakeProtocols = []string{"tcp", "rdma"}

// Bounds on a declaration: it is untrusted input to every engine's start.
const (
	maxTierItemBytes = 512
	maxSecretBytes   = 512
)

// TierError is a problem with a tier's declaration; the task field it
// surfaces under is kv_offload_tier.
type TierError struct {
	Tier string // the tier's name
	Item string // the declaration's item at fault, "" for the whole
	Msg  string
}

func (e *TierError) Error() string {
	where := fmt.Sprintf("kv_offload_tier: tier %q (Nomad variable %s)", e.Tier, TierVariablePath(e.Tier))
	if e.Item != "" {
		where += " item " + e.Item
	}
	return where + ": " + e.Msg
}

// ErrTierNotDeclared is returned (wrapped) by tier sources for a tier that
// has no declaration.
var ErrTierNotDeclared = errors.New("tier is not declared")

// ParseTier validates the items of tier name's declaration. Every problem
// is a *TierError naming the item.
func ParseTier(name string, items map[string]string) (*Tier, error) {
	var errs []error
	bad := func(item, format string, args ...any) {
		errs = append(errs, &TierError{Tier: name, Item: item, Msg: fmt.Sprintf(format, args...)})
	}
	for _, k := range slices.Sorted(maps.Keys(items)) {
		switch {
		case !slices.Contains(tierItems, k):
			bad(k, "unknown item; allowed: %s", strings.Join(tierItems, ", "))
		case len(items[k]) > maxTierItemBytes || strings.ContainsAny(items[k], "\n\r\x00"):
			bad(k, "must be one line of at most %d bytes", maxTierItemBytes)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	t := &Tier{Name: name, Kind: items["kind"], Address: items["address"], Path: items["path"],
		Backend: items["backend"], Protocol: items["protocol"], MetadataServer: items["metadata_server"],
		SecretPath: items["secret_path"], SecretItem: items["secret_item"]}
	if t.SecretPath != "" && t.SecretItem == "" {
		t.SecretItem = DefaultSecretItem
	}
	if s := items["size_gb"]; s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 || f > 1<<20 {
			bad("size_gb", "%q is not a size in GiB (a number >= 0)", s)
		}
		t.SizeGB = f
	}
	for _, err := range t.validate(items["auth"]) {
		bad(err[0], "%s", err[1])
	}
	return t, errors.Join(errs...)
}

// validate returns [item, message] pairs for what is wrong with t.
func (t *Tier) validate(auth string) [][2]string {
	var out [][2]string
	bad := func(item, format string, args ...any) {
		out = append(out, [2]string{item, fmt.Sprintf(format, args...)})
	}
	if !tierNameRE.MatchString(t.Name) {
		bad("", "the name must be 1-64 lower-case letters, digits, '-' or '_'")
	}
	if !slices.Contains(TierKinds, t.Kind) {
		bad("kind", "%q is not a tier kind; allowed: %s", t.Kind, strings.Join(TierKinds, ", "))
		return out
	}
	needsAddress := t.Kind == TierKVCached || t.Kind == TierLMCacheServer || t.Kind == TierMooncake || t.Kind == TierNIXL
	switch {
	case needsAddress && t.Address == "":
		bad("address", "is required for kind %s: host:port, e.g. %q", t.Kind, NodeIPPlaceholder+":6380")
	case !needsAddress && t.Address != "":
		bad("address", "not used by kind %s", t.Kind)
	case t.Address != "":
		host, port, err := net.SplitHostPort(t.Address)
		if p, perr := strconv.Atoi(port); err != nil || perr != nil || p < 1 || p > 65535 || host == "" ||
			(host != NodeIPPlaceholder && strings.ContainsAny(host, "${}/@")) {
			bad("address", "%q is not host:port (host an address, a name or %s)", t.Address, NodeIPPlaceholder)
		}
	}
	switch {
	case t.Kind == TierSharedFS && (t.Path == "" || !path.IsAbs(t.Path) || path.Clean(t.Path) != t.Path):
		bad("path", "kind shared-fs needs the shared directory as a clean absolute path, got %q", t.Path)
	case t.Kind != TierSharedFS && t.Path != "":
		bad("path", "only used by kind shared-fs")
	}
	switch {
	case t.Kind == TierHiCacheStorage && !slices.Contains(HiCacheStorageBackends, t.Backend):
		bad("backend", "kind hicache-storage needs SGLang's storage backend; allowed: %s", strings.Join(HiCacheStorageBackends, ", "))
	case t.Kind != TierHiCacheStorage && t.Backend != "":
		bad("backend", "only used by kind hicache-storage")
	}
	switch {
	case t.Kind != TierMooncake && (t.Protocol != "" || t.MetadataServer != ""):
		bad("protocol", "protocol and metadata_server are only used by kind mooncake")
	case t.Protocol != "" && !slices.Contains(MooncakeProtocols, t.Protocol):
		bad("protocol", "%q is not a Mooncake protocol; allowed: %s", t.Protocol, strings.Join(MooncakeProtocols, ", "))
	case strings.ContainsAny(t.MetadataServer, " \t\"'"):
		bad("metadata_server", "%q is not a Mooncake metadata server (P2PHANDSHAKE, etcd://host:port, http://host:port/metadata)", t.MetadataServer)
	}
	out = append(out, t.validateSecret(auth)...)
	return out
}

// validateSecret checks secret_path, secret_item and auth: a kvcached tier
// has a password unless the declaration says auth = "none".
func (t *Tier) validateSecret(auth string) [][2]string {
	var out [][2]string
	bad := func(item, format string, args ...any) {
		out = append(out, [2]string{item, fmt.Sprintf(format, args...)})
	}
	if t.SecretPath != "" && (!varPathRE.MatchString(t.SecretPath) || strings.Contains(t.SecretPath, "..")) {
		bad("secret_path", "%q is not a Nomad variable path", t.SecretPath)
	}
	if t.SecretItem != "" && !varPathRE.MatchString(t.SecretItem) {
		bad("secret_item", "%q is not a variable item name", t.SecretItem)
	}
	if t.SecretItem != "" && t.SecretPath == "" {
		bad("secret_item", "set without secret_path")
	}
	switch {
	case auth != "" && auth != "none":
		bad("auth", "%q: the only value is \"none\" (a kvcached tier without a password)", auth)
	case t.Kind == TierKVCached && t.SecretPath == "" && auth != "none":
		bad("secret_path", "a kvcached tier needs its password by reference (the Nomad variable kvcached reads it from, e.g. nomad/jobs/oasis-kvcached/kvcached with secret_item = \"redis_password\"); auth = \"none\" declares a tier without one")
	case t.Kind != TierKVCached && t.SecretPath != "":
		bad("secret_path", "kind %s takes no password", t.Kind)
	case auth == "none" && t.SecretPath != "":
		bad("auth", "\"none\" while secret_path names a password; remove one of them")
	}
	return out
}

// NodeAddress is t's address on the node whose address is nodeIP.
func (t *Tier) NodeAddress(nodeIP string) string {
	if !strings.HasPrefix(t.Address, NodeIPPlaceholder+":") {
		return t.Address
	}
	return net.JoinHostPort(nodeIP, strings.TrimPrefix(t.Address, NodeIPPlaceholder+":"))
}

// CheckSecret checks the password read from the secret variable.
func (t *Tier) CheckSecret(secret string, found bool) error {
	switch {
	case !found || secret == "":
		return &TierError{Tier: t.Name, Item: "secret_path", Msg: fmt.Sprintf("Nomad variable %s has no item %q (or it is empty)", t.SecretPath, t.SecretItem)}
	case len(secret) > maxSecretBytes || strings.ContainsAny(secret, "\n\r\x00"):
		return &TierError{Tier: t.Name, Item: "secret_path", Msg: fmt.Sprintf("the password in %s item %s must be one line of at most %d bytes", t.SecretPath, t.SecretItem, maxSecretBytes)}
	}
	return nil
}

// validateTierField checks kv_offload_tier on its own: a tier name, and no
// field the tier renders set beside it.
func (c TaskConfig) validateTierField() error {
	if c.KVOffloadTier == "" {
		return nil
	}
	if !tierNameRE.MatchString(c.KVOffloadTier) {
		return fieldErr("kv_offload_tier", "%q is not a tier name (1-64 lower-case letters, digits, '-' or '_')", c.KVOffloadTier)
	}
	var errs []error
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"kv_offload", c.KVOffload != "" && c.KVOffload != OffloadNone},
		{"kv_offload_size_gb", c.KVOffloadSizeGB != 0},
		{"kvcached_address", c.KVCachedAddress != ""},
		{"hicache_storage_backend", c.HiCacheStorageBackend != ""},
	} {
		if f.set {
			errs = append(errs, fieldErr(f.name, "set beside kv_offload_tier = %q, which renders it from the tier's declaration; remove one of them", c.KVOffloadTier))
		}
	}
	return errors.Join(errs...)
}

// WithTier returns c (normalized, with kv_offload_tier set) with the
// offload fields rendered from tier t, for the node whose address is
// nodeIP; kv_offload_tier is cleared in the result, which Validate then
// checks as any other config. Errors are *TierError or name kv_offload_tier.
func (c TaskConfig) WithTier(t *Tier, nodeIP string) (TaskConfig, error) {
	if t == nil || t.Name != c.KVOffloadTier {
		return c, fieldErr("kv_offload_tier", "the declaration of tier %q was not read", c.KVOffloadTier)
	}
	c.KVOffloadTier = ""
	c.KVOffloadSizeGB = Float(t.SizeGB)
	switch t.Kind {
	case TierKVCached:
		c.KVOffload, c.KVCachedAddress = OffloadKVCached, t.NodeAddress(nodeIP)
	case TierLMCacheServer:
		c.KVOffload = OffloadLMCache
		if t.SizeGB <= 0 {
			return c, &TierError{Tier: t.Name, Item: "size_gb", Msg: "kind lmcache-server needs the CPU tier in front of the server (LMCache's max_local_cpu_size, GiB > 0)"}
		}
	case TierSharedFS, TierMooncake:
		if c.Engine == EngineVLLM || c.Engine == EngineSim {
			return c.withVLLMStoreTier(t)
		}
		c.KVOffload, c.HiCacheStorageBackend = OffloadHiCache, "file"
		if t.Kind == TierMooncake {
			c.HiCacheStorageBackend = "mooncake"
		}
	case TierHiCacheStorage:
		c.KVOffload, c.HiCacheStorageBackend = OffloadHiCache, t.Backend
	default:
		return c, &TierError{Tier: t.Name, Item: "kind", Msg: fmt.Sprintf("kind %s is declared but not rendered by this driver (rendered: %s, %s, %s, %s, %s): %s",
			t.Kind, TierKVCached, TierLMCacheServer, TierMooncake, TierHiCacheStorage, TierSharedFS, nixlNotRendered)}
	}
	if err := CheckCombination(c.Engine, c.KVOffload, c.Role); err != nil {
		return c, fieldErr("kv_offload_tier", "tier %q (kind %s) renders kv_offload = %q: %v", t.Name, t.Kind, c.KVOffload, err)
	}
	return c, nil
}

// nixlNotRendered says why a nixl tier is refused at render: no engine
// Oasis runs takes a NIXL storage agent's address as a KV offload tier.
const nixlNotRendered = "vLLM's NixlConnector and SGLang's nixl transfer backend move KV between a prefill and a decode server (role prefill/decode) and take no storage address; NIXL's storage plugins are reached through LMCache's or llm-d's own configuration, which this driver does not render"

// withVLLMStoreTier renders a shared-fs or mooncake tier for vLLM (and the
// sim, which renders like it): shared-fs through vLLM's OffloadingConnector
// with llm-d's SharedStorageOffloadingSpec (kv_offload = "native", the
// offloading connector, with the tier's spec), mooncake as LMCache's
// mooncakestore:// remote (kv_offload = "lmcache"). Both need size_gb: the
// staging CPU buffer of the first, LMCache's CPU tier of the second.
func (c TaskConfig) withVLLMStoreTier(t *Tier) (TaskConfig, error) {
	if t.SizeGB <= 0 {
		what := "LMCache's CPU tier in front of the Mooncake store (max_local_cpu_size"
		if t.Kind == TierSharedFS {
			what = "the CPU staging buffer of llm-d's SharedStorageOffloadingSpec (max_staging_memory_gb, rounded up"
		}
		return c, &TierError{Tier: t.Name, Item: "size_gb", Msg: fmt.Sprintf("kind %s with engine %s needs %s, GiB > 0)", t.Kind, c.Engine, what)}
	}
	c.KVOffload = OffloadLMCache
	if t.Kind == TierSharedFS {
		c.KVOffload = OffloadNative
	}
	if err := CheckCombination(c.Engine, c.KVOffload, c.Role); err != nil {
		return c, fieldErr("kv_offload_tier", "tier %q (kind %s) renders kv_offload = %q: %v", t.Name, t.Kind, c.KVOffload, err)
	}
	return c, nil
}
