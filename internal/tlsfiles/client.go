package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
)

// What a dialling side (internal/meshid's files identity) reads, and a
// reload on demand.

// Reload checks the files now, whatever the interval, and loads them if any
// changed since the last check. The error is that of a failed load; the last
// good files stay in use.
func (f *Files) Reload() error { return f.check() }

// Certificate is the certificate and key as of the last check (nil without
// CertFile); meshid serves and dials with it when there is no Consul.
func (f *Files) Certificate() *tls.Certificate { return f.current().cert }

// CAs is the CA bundle as of the last check (nil without ClientCAFile).
func (f *Files) CAs() *x509.CertPool { return f.current().cas }
