package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// The dialling side of the same files (router federation dials with it),
// and a reload on demand.

// Reload checks the files now, whatever the interval, and loads them if any
// changed since the last check. The error is that of a failed load; the last
// good files stay in use.
func (f *Files) Reload() error { return f.check() }

// ClientConfig returns a TLS 1.2+ client configuration that presents the
// certificate from the files when a server asks for one and, with
// ClientCAFile, verifies the server's certificate against the bundle as it
// is at each handshake (the system roots otherwise). Set ServerName when
// dialling an address that is not the certificate's name.
func (f *Files) ClientConfig() *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.cfg.CertFile != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return f.current().cert, nil
		}
	}
	if f.cfg.ClientCAFile != "" {
		// RootCAs is fixed for a configuration's life; the bundle is not.
		// Verification is done below against the current bundle instead,
		// for full and resumed handshakes alike.
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error { return f.verifyServer(cs) }
	}
	return c
}

// verifyServer checks a server's chain and name as crypto/tls would with
// RootCAs set to the current bundle.
func (f *Files) verifyServer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tlsfiles: server presented no certificate")
	}
	opts := x509.VerifyOptions{Roots: f.current().cas, DNSName: cs.ServerName, Intermediates: x509.NewCertPool()}
	for _, ic := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	_, err := cs.PeerCertificates[0].Verify(opts)
	return err
}

// Certificate is the certificate and key as of the last check (nil without
// CertFile); meshid serves and dials with it when there is no Consul.
func (f *Files) Certificate() *tls.Certificate { return f.current().cert }

// CAs is the CA bundle as of the last check (nil without ClientCAFile).
func (f *Files) CAs() *x509.CertPool { return f.current().cas }
