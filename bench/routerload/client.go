package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// clientTLS is the TLS configuration for https targets: the CA in caFile
// (PEM) or the system's roots, and ALPN offering HTTP/1.1 only, or h2 first
// when h2 is set.
func clientTLS(caFile string, h2 bool) (*tls.Config, error) {
	cfg := &tls.Config{NextProtos: []string{"http/1.1"}}
	if h2 {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-ca %s: no PEM certificate in it", caFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// newClient is one target's client: its own connection pool, keep-alive,
// HTTP/1.1 (and HTTP/2 to https servers that choose it by ALPN when h2 is
// set). TLS connections share a session cache, so a connection opened after
// the first resumes a session (Go's http client keeps none by default; this
// is what a long-lived client does, and both nginx and Go's server resume).
// Every connection opened is counted in st, with what it negotiated.
func newClient(base *tls.Config, h2 bool, st *connStats) *http.Client {
	d := &net.Dialer{Timeout: 2 * time.Second}
	cfg := base.Clone()
	cfg.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(h2)
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err == nil {
				st.add("HTTP/1.1 (plain)", false, false)
			}
			return c, err
		},
		// TLS here rather than in the Transport, to see each handshake.
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			raw, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			host, _, _ := net.SplitHostPort(addr)
			c := cfg.Clone() // shares the session cache
			c.ServerName = host
			tc := tls.Client(raw, c)
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			cs := tc.ConnectionState()
			st.add(describeTLS(cs), true, cs.DidResume)
			return tc, nil
		},
		Protocols:           &protos,
		MaxIdleConnsPerHost: 4096, IdleConnTimeout: 60 * time.Second, DisableCompression: true,
	}
	return &http.Client{Transport: tr}
}

// describeTLS names what a TLS connection negotiated: the HTTP protocol
// chosen by ALPN, the TLS version, key exchange and cipher suite (each of
// which costs the server CPU differently).
func describeTLS(cs tls.ConnectionState) string {
	proto := "HTTP/1.1"
	if cs.NegotiatedProtocol == "h2" {
		proto = "HTTP/2"
	}
	return fmt.Sprintf("%s over %s (%s, %s)", proto, tls.VersionName(cs.Version), cs.CurveID, tls.CipherSuiteName(cs.CipherSuite))
}

// connStats counts one target's connections. Only dials touch it.
type connStats struct {
	mu      sync.Mutex
	opened  int
	tls     int // TLS handshakes (full + resumed)
	resumed int
	kinds   map[string]int // describeTLS (or plain) → connections
}

func newConnStats() *connStats { return &connStats{kinds: map[string]int{}} }

func (s *connStats) add(kind string, isTLS, resumed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opened++
	s.kinds[kind]++
	if isTLS {
		s.tls++
		if resumed {
			s.resumed++
		}
	}
}

// protocol is what the target's connections negotiated so far, most used
// first; "none" before any connection.
func (s *connStats) protocol() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.kinds) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(s.kinds))
	for k := range s.kinds {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int {
		if s.kinds[a] != s.kinds[b] {
			return s.kinds[b] - s.kinds[a]
		}
		return strings.Compare(a, b)
	})
	if len(kinds) == 1 {
		return kinds[0]
	}
	for i, k := range kinds {
		kinds[i] = fmt.Sprintf("%s ×%d", k, s.kinds[k])
	}
	return strings.Join(kinds, " + ")
}

type connCounts struct{ opened, tls, resumed int }

func (s *connStats) counts() connCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return connCounts{s.opened, s.tls, s.resumed}
}

func snapshot(targets []target) map[string]connCounts {
	m := map[string]connCounts{}
	for _, t := range targets {
		m[t.name] = t.conns.counts()
	}
	return m
}

// protocolLine is the phase header's protocol per target.
func protocolLine(targets []target) string {
	parts := make([]string, len(targets))
	for i, t := range targets {
		parts[i] = t.name + " " + t.conns.protocol()
	}
	return "protocol: " + strings.Join(parts, "; ")
}

// connLine is how many connections each target opened since before: with
// keep-alive a small number (the pool growing to the concurrency), each a
// handshake inside some request's latency.
func connLine(targets []target, before map[string]connCounts) string {
	parts := make([]string, len(targets))
	for i, t := range targets {
		now, was := t.conns.counts(), before[t.name]
		parts[i] = fmt.Sprintf("%s %d", t.name, now.opened-was.opened)
		if n := now.tls - was.tls; n > 0 {
			parts[i] += fmt.Sprintf(" (TLS: %d full, %d resumed)", n-(now.resumed-was.resumed), now.resumed-was.resumed)
		}
	}
	return "connections opened: " + strings.Join(parts, ", ")
}
