package discovery

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// Service meta is written by whoever may register a service in Consul or
// Nomad, which is more people than may spend the router's API keys. A hosted
// upstream (oasis_upstream) makes the router send requests, with the key in
// the variable oasis_upstream_key_env names, to a URL from that meta; so the
// operator names the upstreams and key variables the router accepts, in the
// router's own configuration, and a registration outside them never enters
// the pool.

// Reasons a registration's hosted upstream is refused; each is also the
// reason label of oasis_router_hosted_rejected_total.
var (
	// ErrUpstreamInvalid: oasis_upstream is not an absolute https URL
	// (http only to a loopback host) without user, query or fragment and
	// with a clean path.
	ErrUpstreamInvalid = errors.New("invalid upstream URL")
	// ErrUpstreamNotAllowed: no allow-list entry matches oasis_upstream.
	ErrUpstreamNotAllowed = errors.New("upstream not allow-listed")
	// ErrKeyEnvNotAllowed: oasis_upstream_key_env is not allow-listed, or
	// not for this upstream.
	ErrKeyEnvNotAllowed = errors.New("key variable not allow-listed")
	// ErrKeyEnvWithoutUpstream: a key variable on an engine without a hosted
	// upstream would send the key to a registered address in clear text.
	ErrKeyEnvWithoutUpstream = errors.New("key variable without a hosted upstream")
	// ErrBadPattern: an allow-list entry cannot be parsed.
	ErrBadPattern = errors.New("bad allow-list entry")
)

// HostedError is why one registration's hosted upstream is refused. Err is
// one of the Err* reasons above.
type HostedError struct {
	Upstream, KeyEnv string
	Err              error
}

func (e *HostedError) Error() string {
	return fmt.Sprintf("hosted upstream %q with key variable %q: %v", e.Upstream, e.KeyEnv, e.Err)
}

func (e *HostedError) Unwrap() error { return e.Err }

// Reason is the short label of the refusal, for metrics.
func (e *HostedError) Reason() string {
	switch e.Err {
	case ErrUpstreamInvalid:
		return "invalid_upstream"
	case ErrUpstreamNotAllowed:
		return "upstream_not_allowed"
	case ErrKeyEnvNotAllowed:
		return "key_env_not_allowed"
	case ErrKeyEnvWithoutUpstream:
		return "key_env_without_upstream"
	}
	return "other"
}

// HostedPolicy is the operator's allow-list of hosted upstreams and of the
// environment variables whose keys the router may send to them. The zero
// value and nil allow no hosted upstream at all. Immutable once parsed.
type HostedPolicy struct {
	upstreams []urlPattern
	// keyEnvs maps an allowed variable to the upstreams it may be sent to;
	// a nil list means any allowed upstream.
	keyEnvs map[string][]urlPattern
}

// urlPattern is one allowed base URL: scheme, host (or "*." and a domain:
// exactly one more leading label), port (the scheme's default when absent)
// and a path prefix matched at segment boundaries ("" allows every path).
type urlPattern struct {
	scheme, host, port, path string
	wildcard                 bool
}

// ParseHostedPolicy parses the allow-lists. Each upstream is a base URL,
// "https://api.openai.com/v1", or a host pattern whose first label is "*",
// "https://*.openai.azure.com/openai"; an upstream matches when scheme, host
// and port are equal and its path is the entry's or below it. Each key
// variable is NAME, usable with any allowed upstream, or NAME=PATTERN,
// usable only with upstreams matching PATTERN (which must be allowed as
// well). Both must be https, except http to a loopback host (tests).
func ParseHostedPolicy(upstreams, keyEnvs []string) (*HostedPolicy, error) {
	p := &HostedPolicy{keyEnvs: map[string][]urlPattern{}}
	for _, e := range upstreams {
		pat, err := parsePattern(e)
		if err != nil {
			return nil, err
		}
		p.upstreams = append(p.upstreams, pat)
	}
	any := map[string]bool{}
	for _, e := range keyEnvs {
		name, pattern, bound := strings.Cut(strings.TrimSpace(e), "=")
		if !validEnvName(name) {
			return nil, fmt.Errorf("key variable %q: not a variable name: %w", e, ErrBadPattern)
		}
		if !bound {
			any[name] = true
			p.keyEnvs[name] = nil
			continue
		}
		pat, err := parsePattern(pattern)
		if err != nil {
			return nil, fmt.Errorf("key variable %s: %w", name, err)
		}
		if !any[name] {
			p.keyEnvs[name] = append(p.keyEnvs[name], pat)
		}
	}
	return p, nil
}

// SplitList splits a comma-separated flag value, dropping empty entries.
func SplitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Allow reports whether an engine registered with oasis_upstream upstream
// and oasis_upstream_key_env keyEnv may be used; the error is a *HostedError.
// An engine with neither is not hosted and always allowed.
func (p *HostedPolicy) Allow(upstream, keyEnv string) error {
	if upstream == "" && keyEnv == "" {
		return nil
	}
	refuse := func(err error) error { return &HostedError{Upstream: upstream, KeyEnv: keyEnv, Err: err} }
	if upstream == "" {
		return refuse(ErrKeyEnvWithoutUpstream)
	}
	u, err := parseUpstream(upstream)
	if err != nil {
		return refuse(ErrUpstreamInvalid)
	}
	if p == nil || !matchAny(p.upstreams, u) {
		return refuse(ErrUpstreamNotAllowed)
	}
	if keyEnv == "" {
		return nil
	}
	pats, ok := p.keyEnvs[keyEnv]
	if !ok || pats != nil && !matchAny(pats, u) {
		return refuse(ErrKeyEnvNotAllowed)
	}
	return nil
}

// Empty reports whether the policy allows no hosted upstream.
func (p *HostedPolicy) Empty() bool { return p == nil || len(p.upstreams) == 0 }

func matchAny(pats []urlPattern, u urlPattern) bool {
	for _, p := range pats {
		if p.match(u) {
			return true
		}
	}
	return false
}

func (p urlPattern) match(u urlPattern) bool {
	if u.scheme != p.scheme || u.port != p.port {
		return false
	}
	if p.wildcard {
		label, rest, ok := strings.Cut(u.host, ".")
		if !ok || label == "" || rest != p.host {
			return false
		}
	} else if u.host != p.host {
		return false
	}
	return p.path == "" || u.path == p.path || strings.HasPrefix(u.path, p.path+"/")
}

// parsePattern parses an allow-list entry: an upstream URL whose host may
// start with "*.".
func parsePattern(s string) (urlPattern, error) {
	bad := func(why string) (urlPattern, error) {
		return urlPattern{}, fmt.Errorf("upstream %q: %s: %w", s, why, ErrBadPattern)
	}
	raw := strings.TrimSpace(s)
	u, err := url.Parse(raw)
	if err != nil {
		return bad("not a URL")
	}
	wildcard := false
	if rest, ok := strings.CutPrefix(u.Host, "*."); ok {
		// At least a domain and a top-level label after the wildcard:
		// "*.com" would allow anyone's host.
		if !strings.Contains(strings.Split(rest, ":")[0], ".") {
			return bad(`a wildcard needs a domain of two labels or more after "*."`)
		}
		// Parsed like a real host, then the label dropped.
		wildcard, raw = true, strings.Replace(raw, "://*.", "://x.", 1)
	}
	p, err := parseUpstream(raw)
	if err != nil {
		return bad(err.Error())
	}
	if wildcard {
		if p.scheme != "https" {
			return bad("a wildcard needs https")
		}
		p.wildcard, p.host = true, strings.TrimPrefix(p.host, "x.")
		// "*.co.uk" or "*.github.io" would allow anyone's host: every name
		// under a public suffix is registered by someone else.
		if net.ParseIP(p.host) != nil {
			return bad("a wildcard needs a domain, not an address")
		}
		if suffix, _ := publicsuffix.PublicSuffix(p.host); suffix == p.host {
			return bad(fmt.Sprintf(`a wildcard over the public suffix %q would allow anyone's host; name a registered domain after "*."`, suffix))
		}
	}
	return p, nil
}

// parseUpstream parses an upstream base URL into its comparable parts.
func parseUpstream(s string) (urlPattern, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return urlPattern{}, err
	case u.Scheme != "https" && u.Scheme != "http":
		return urlPattern{}, errors.New("scheme must be https")
	case u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return urlPattern{}, errors.New("no user, query or fragment allowed")
	case u.RawPath != "":
		return urlPattern{}, errors.New("path must not be escaped")
	}
	host := strings.ToLower(u.Hostname())
	if !validHost(host) {
		return urlPattern{}, fmt.Errorf("bad host %q", u.Hostname())
	}
	if u.Scheme == "http" && !loopbackHost(host) {
		return urlPattern{}, errors.New("scheme must be https (http only to a loopback host)")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	p := strings.TrimSuffix(u.Path, "/")
	if p != "" && path.Clean(p) != p {
		return urlPattern{}, errors.New("path must be clean (no '.', '..' or '//')")
	}
	return urlPattern{scheme: u.Scheme, host: host, port: port, path: p}, nil
}

func validHost(h string) bool {
	if h == "" {
		return false
	}
	if net.ParseIP(h) != nil {
		return true
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range s {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
