package tlsfiles

import (
	"crypto/tls"
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
