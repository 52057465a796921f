package sinkconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
)

// TLSConfig is the TLS section shared by every sink's configuration.
// Certificate verification is on unless InsecureSkipVerify says otherwise.
type TLSConfig struct {
	// Enabled turns TLS on with the system roots when no file is given.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of roots to trust instead of the system's.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and key (mutual TLS).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name verified in the server's certificate.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify disables certificate verification. Off by default;
	// for tests only.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// On reports whether any TLS setting asks for TLS.
func (c TLSConfig) On() bool {
	return c.Enabled || c.CAFile != "" || c.CertFile != "" || c.InsecureSkipVerify
}

// Build returns the *tls.Config, or nil when TLS is off. Errors name the
// field (prefixed by field, e.g. "tls").
func (c TLSConfig) Build(field string) (*tls.Config, error) {
	if !c.On() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %w", field, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file: %s holds no PEM certificate", field, c.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New(field + ".cert_file and " + field + ".key_file: give both or neither")
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file: %w", field, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// IsTLSError reports whether err comes from a failed TLS handshake: a
// certificate that is invalid, untrusted or for another host, a peer that
// does not speak TLS, or an alert from the peer (such as a refused or
// missing client certificate). Such a failure is the destination's, or the
// sink's settings', never an event's.
func IsTLSError(err error) bool {
	var (
		verifyErr   *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalid     x509.CertificateInvalidError
		recordErr   tls.RecordHeaderError
		alertErr    tls.AlertError
		opErr       *net.OpError
	)
	return errors.As(err, &verifyErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) ||
		errors.As(err, &invalid) || errors.As(err, &recordErr) || errors.As(err, &alertErr) ||
		errors.As(err, &opErr) && opErr.Op == "remote error"
}
