package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
)

// ErrNoCertificate: a server handshake, or a client asked for a certificate,
// without CertFile.
var ErrNoCertificate = errors.New("tlsfiles: no certificate configured")

// ServerConfig returns a TLS 1.2+ server configuration whose certificate,
// and with ClientCAFile the CAs that client certificates must chain to
// (tls.RequireAndVerifyClientCert), follow the files.
//
// With ClientCAFile each handshake gets a copy of the returned configuration
// (GetConfigForClient): set NextProtos on it yourself before serving, since
// additions made to another copy (http.Server's) are not seen. Session
// tickets are then off: a resumed session skips the client certificate's
// verification, so a CA removed from the bundle would keep admitting its
// clients for as long as their tickets lived.
func (f *Files) ServerConfig() *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := f.current().cert; c != nil {
				return c, nil
			}
			return nil, ErrNoCertificate
		},
	}
	if f.cfg.ClientCAFile == "" {
		return base
	}
	base.SessionTicketsDisabled = true
	base.ClientAuth = tls.RequireAndVerifyClientCert
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = f.current().cas
		return c, nil
	}
	return base
}

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
