package email

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"strings"
	"time"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// TLS modes of SMTPConfig.TLS.
const (
	// TLSStartTLS connects in plain text and upgrades with STARTTLS; a server
	// that does not offer STARTTLS is reported unavailable.
	TLSStartTLS = "starttls"
	// TLSImplicit speaks TLS from the first byte (SMTPS, usually port 465).
	TLSImplicit = "implicit"
	// TLSNone never encrypts. Meant for a local relay or a test server.
	TLSNone = "none"
)

// Config configures the email sink: everything under the sink's entry in the
// YAML `sinks:` list except `name` and `type`.
type Config struct {
	// SMTP is the submission server. Required.
	SMTP SMTPConfig `yaml:"smtp"`
	// From is the sender, as "shop@example.com" or "Shop <shop@example.com>".
	// It is the From header and the envelope sender; its domain is the right
	// part of every Message-ID. Required.
	From string `yaml:"from"`
	// TemplatesDir holds the body templates: NAME.txt (text/template) and
	// NAME.html (html/template), at least one of the two per name. All files
	// of one kind are parsed together at New, so they may call each other
	// ({{template "footer.html" .}}). Required.
	TemplatesDir string `yaml:"templates_dir"`
	// Template is the template name used when the payload has no
	// TemplateField. Defaults to none: such an event is dead-lettered.
	Template string `yaml:"template"`
	// Subject is the subject used when the payload has no SubjectField.
	// Defaults to none: such an event is dead-lettered.
	Subject string `yaml:"subject"`
	// ToField is the payload path of the recipient: a string holding one
	// address or a comma-separated list, or an array of address strings.
	// Dotted paths walk nested objects ("customer.email"). Defaults to "to".
	ToField string `yaml:"to_field"`
	// SubjectField is the payload path of the subject. Defaults to "subject".
	SubjectField string `yaml:"subject_field"`
	// TemplateField is the payload path of the template name. Defaults to
	// "template".
	TemplateField string `yaml:"template_field"`
	// Timeout bounds connecting (TCP, TLS, greeting, AUTH) and each SMTP
	// command, including the wait for the server's answer to a message.
	// Defaults to 30s.
	Timeout time.Duration `yaml:"timeout"`
}

// SMTPConfig is the `smtp:` section of Config.
type SMTPConfig struct {
	// Host is the server's host name or IP address. Required.
	Host string `yaml:"host"`
	// Port is the server's TCP port. Defaults to 587 with starttls, 465
	// with implicit and 25 with none.
	Port int `yaml:"port"`
	// Username turns on AUTH PLAIN. Defaults to none (no AUTH).
	Username string `yaml:"username"`
	// Password is the AUTH PLAIN password; required with Username.
	Password sinkconfig.Secret `yaml:"password"`
	// TLS is the transport security: "starttls", "implicit" or "none".
	// Defaults to "none" when Host is localhost or a loopback address (a
	// local relay or test server), and to "starttls" otherwise. STARTTLS is
	// then required: it is never skipped because the server does not offer it.
	TLS string `yaml:"tls"`
	// TLSConfig sets the roots, client certificate and server name for
	// starttls and implicit. Defaults to the system roots and Host.
	TLSConfig sinkconfig.TLSConfig `yaml:"tls_config"`
}

// WithDefaults returns c with zero fields set to their documented defaults.
func (c Config) WithDefaults() Config {
	c.ToField = cmp.Or(c.ToField, "to")
	c.SubjectField = cmp.Or(c.SubjectField, "subject")
	c.TemplateField = cmp.Or(c.TemplateField, "template")
	c.Timeout = cmp.Or(c.Timeout, 30*time.Second)
	if c.SMTP.TLS == "" {
		c.SMTP.TLS = TLSStartTLS
		if isLoopback(c.SMTP.Host) {
			c.SMTP.TLS = TLSNone
		}
	}
	if c.SMTP.Port == 0 {
		switch c.SMTP.TLS {
		case TLSImplicit:
			c.SMTP.Port = 465
		case TLSNone:
			c.SMTP.Port = 25
		default:
			c.SMTP.Port = 587
		}
	}
	return c
}

// Validate reports the first invalid setting, naming its key relative to the
// sink's entry. It does not read the templates: New does.
func (c Config) Validate() error {
	c = c.WithDefaults()
	s := c.SMTP
	switch {
	case s.Host == "":
		return errors.New("smtp.host: required")
	case s.Port < 1 || s.Port > 65535:
		return fmt.Errorf("smtp.port: %d is not a TCP port", s.Port)
	case s.TLS != TLSStartTLS && s.TLS != TLSImplicit && s.TLS != TLSNone:
		return fmt.Errorf("smtp.tls: %q is not one of starttls, implicit, none", s.TLS)
	case s.TLS == TLSNone && s.TLSConfig.On():
		return errors.New("smtp.tls_config: set, but smtp.tls is none")
	case s.Password != "" && s.Username == "":
		return errors.New("smtp.password: set without smtp.username")
	case s.Username != "" && s.Password == "":
		return errors.New("smtp.password: required with smtp.username")
	case s.Username != "" && s.TLS == TLSNone && !isLoopback(s.Host):
		return fmt.Errorf("smtp.username: AUTH would send the password in clear text to %s; use smtp.tls starttls or implicit", s.Host)
	case c.From == "":
		return errors.New("from: required")
	case c.TemplatesDir == "":
		return errors.New("templates_dir: required")
	case c.Timeout < 0:
		return fmt.Errorf("timeout: must be positive, got %s", c.Timeout)
	}
	if _, err := mail.ParseAddress(c.From); err != nil {
		return fmt.Errorf("from: %q is not a valid address: %w", c.From, err)
	}
	for _, f := range []struct{ key, path string }{
		{"to_field", c.ToField}, {"subject_field", c.SubjectField}, {"template_field", c.TemplateField},
	} {
		for _, part := range strings.Split(f.path, ".") {
			if part == "" {
				return fmt.Errorf("%s: %q has an empty path segment", f.key, f.path)
			}
		}
	}
	return nil
}

// isLoopback reports whether host names this machine.
func isLoopback(host string) bool {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
