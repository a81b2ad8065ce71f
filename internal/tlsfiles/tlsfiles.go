// Package tlsfiles serves TLS from PEM files that change while the process
// runs: a certificate and key pair, and optionally a CA bundle that peers'
// certificates must chain to (mutual TLS). Files rendered by Nomad's template
// block or a certificate manager are replaced in place; every handshake sees
// the pair as of the last check, and the files are checked at most once per
// CheckInterval, so a rotation needs no restart and drops no connection (a
// connection keeps the certificate it was made with).
//
// A reload that fails (a key that does not match, an empty bundle) keeps
// the last good files, is logged and counted; the next change of any file
// is tried again. Files that do not load are first taken for a rotation
// under way (one file written, the other not yet) and retried at the next
// checks; they count as a failure two intervals later.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// Config names the files. CertFile and KeyFile come together; ClientCAFile
// may stand alone (a client that verifies servers but has no certificate).
type Config struct {
	CertFile string // PEM certificate chain, leaf first
	KeyFile  string // PEM private key of the leaf
	// ClientCAFile is a PEM bundle of the CAs that sign peers' certificates:
	// a server requires a client certificate chaining to one of them; a
	// client verifies the server's against them (system roots when empty).
	ClientCAFile string

	Logger hclog.Logger // nil: no logs
	// Registerer, when set, gets <Namespace>_tls_reloads_total{result} and
	// <Namespace>_tls_certificate_not_after_timestamp_seconds.
	Registerer prometheus.Registerer
	Namespace  string        // metric namespace; default "oasis"
	Interval   time.Duration // least time between two checks of the files; default 1s

	now func() time.Time // tests
}

// ErrNoFiles: a Config names no file at all.
var ErrNoFiles = errors.New("tlsfiles: no certificate, key or CA file")

// FileError is a file that cannot be used. Field names the Config field
// (CertFile, KeyFile, ClientCAFile), so callers can name their own flag.
type FileError struct {
	Field, Path string
	Err         error
}

func (e *FileError) Error() string { return fmt.Sprintf("%s %s: %v", e.Field, e.Path, e.Err) }
func (e *FileError) Unwrap() error { return e.Err }

// Files is the current certificate and CA bundle. Safe for concurrent use.
type Files struct {
	cfg  Config
	cur  atomic.Pointer[state]
	next atomic.Int64 // unix nanoseconds before which no check is due
	mu   sync.Mutex   // one check at a time
	seen [3]stamp     // the files as last loaded or reported bad
	// failingSince is when files that do not load were first seen since
	// the last load or report (zero: none).
	failingSince time.Time
	reloads      *prometheus.CounterVec
}

// state is one good set of files.
type state struct {
	cert *tls.Certificate // nil without CertFile
	cas  *x509.CertPool   // nil without ClientCAFile
}

// stamp identifies one version of a file without reading it.
type stamp struct {
	mod  time.Time
	size int64
}

// New loads the files; a missing or bad file is a *FileError.
func New(cfg Config) (*Files, error) {
	if cfg.CertFile == "" && cfg.KeyFile == "" && cfg.ClientCAFile == "" {
		return nil, ErrNoFiles
	}
	if cfg.CertFile == "" && cfg.KeyFile != "" {
		return nil, &FileError{Field: "CertFile", Err: errors.New("required with KeyFile")}
	}
	if cfg.KeyFile == "" && cfg.CertFile != "" {
		return nil, &FileError{Field: "KeyFile", Err: errors.New("required with CertFile")}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "oasis"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	f := &Files{cfg: cfg}
	f.seen = f.stamps()
	st, err := f.load()
	if err != nil {
		return nil, err
	}
	f.cur.Store(st)
	f.next.Store(cfg.now().Add(cfg.Interval).UnixNano())
	if err := f.register(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *Files) register() error {
	if f.cfg.Registerer == nil {
		return nil
	}
	f.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: f.cfg.Namespace, Name: "tls_reloads_total",
		Help: "Reloads of the TLS certificate, key and CA files after they changed, by result (ok|error: the last good files stay)."},
		[]string{"result"})
	notAfter := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: f.cfg.Namespace,
		Name: "tls_certificate_not_after_timestamp_seconds", Help: "When the served TLS certificate expires (unix seconds)."},
		func() float64 {
			if c := f.cur.Load().cert; c != nil && c.Leaf != nil {
				return float64(c.Leaf.NotAfter.Unix())
			}
			return 0
		})
	for _, c := range []prometheus.Collector{f.reloads, notAfter} {
		if err := f.cfg.Registerer.Register(c); err != nil {
			return fmt.Errorf("tlsfiles: registering metrics: %w", err)
		}
	}
	return nil
}

// current returns the files to use now, reloading them first when a check
// is due and they changed since the last one.
func (f *Files) current() *state {
	now := f.cfg.now()
	if next := f.next.Load(); now.UnixNano() >= next && f.next.CompareAndSwap(next, now.Add(f.cfg.Interval).UnixNano()) {
		f.check()
	}
	return f.cur.Load()
}

func (f *Files) check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.stamps()
	if st == f.seen {
		return nil
	}
	next, err := f.load()
	if err != nil {
		// Renderers write the files one by one (Nomad's template block,
		// cert-manager): a new certificate beside the old key is most
		// likely a rotation under way. It is tried again at the next
		// checks, and counts as a failure only when it still does not
		// load two intervals after it was first seen.
		now := f.cfg.now()
		if f.failingSince.IsZero() {
			f.failingSince = now
		}
		if now.Sub(f.failingSince) < 2*f.cfg.Interval {
			f.cfg.Logger.Debug("TLS files changed but do not load yet; trying again", "error", err)
			return err
		}
		f.seen, f.failingSince = st, time.Time{}
		f.count("error")
		f.cfg.Logger.Error("reloading TLS files failed; keeping the current ones", "error", err)
		return err
	}
	f.seen, f.failingSince = st, time.Time{}
	f.cur.Store(next)
	f.count("ok")
	f.cfg.Logger.Info("reloaded TLS files", "cert", f.cfg.CertFile, "client_ca", f.cfg.ClientCAFile)
	return nil
}

func (f *Files) count(result string) {
	if f.reloads != nil {
		f.reloads.WithLabelValues(result).Inc()
	}
}

// stamps reads the files' modification times and sizes; a file that cannot
// be read has the zero stamp (it changes when it appears).
func (f *Files) stamps() [3]stamp {
	var out [3]stamp
	for i, p := range []string{f.cfg.CertFile, f.cfg.KeyFile, f.cfg.ClientCAFile} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			out[i] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	return out
}

// load reads and checks every file.
func (f *Files) load() (*state, error) {
	st := &state{}
	if f.cfg.CertFile != "" {
		certPEM, err := os.ReadFile(f.cfg.CertFile)
		if err != nil {
			return nil, &FileError{Field: "CertFile", Path: f.cfg.CertFile, Err: err}
		}
		keyPEM, err := os.ReadFile(f.cfg.KeyFile)
		if err != nil {
			return nil, &FileError{Field: "KeyFile", Path: f.cfg.KeyFile, Err: err}
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, &FileError{Field: "KeyFile", Path: f.cfg.KeyFile, Err: err}
		}
		st.cert = &pair
	}
	if f.cfg.ClientCAFile != "" {
		caPEM, err := os.ReadFile(f.cfg.ClientCAFile)
		if err != nil {
			return nil, &FileError{Field: "ClientCAFile", Path: f.cfg.ClientCAFile, Err: err}
		}
		st.cas = x509.NewCertPool()
		if !st.cas.AppendCertsFromPEM(caPEM) {
			return nil, &FileError{Field: "ClientCAFile", Path: f.cfg.ClientCAFile, Err: errors.New("no PEM certificate in the file")}
		}
	}
	return st, nil
}
