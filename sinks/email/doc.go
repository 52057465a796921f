// Package email is the Herald sink that turns each event into one email and
// submits it to an SMTP server.
//
// # Messages
//
// An event's payload must be a JSON object. The sink reads from it, at
// configurable dotted paths:
//
//   - the recipient (Config.ToField, default "to"): one address
//     ("ann@example.com", "Ann <ann@example.com>"), a comma-separated list
//     of them, or an array of address strings;
//   - the subject (Config.SubjectField, default "subject"), else
//     Config.Subject;
//   - the template name (Config.TemplateField, default "template"), else
//     Config.Template.
//
// The body comes from Config.TemplatesDir: NAME.txt is a text/template,
// NAME.html an html/template (which escapes payload values for HTML). A name
// may have either file or both; with both, the email is multipart/alternative
// with the text part first. Templates are parsed once, by New. They execute
// with the decoded payload as data, so {{.customer.name}} reads the payload's
// customer.name, plus .Event (EventData: ID, Topic, Key, CreatedAt, Headers),
// which shadows a payload field called "Event". Numbers render as written in
// the payload (12.50 stays 12.50). A field the template uses but the payload
// lacks fails the event rather than mailing "<no value>": test optional
// fields with {{with index . "coupon"}}…{{end}}.
//
// Every message carries Date (the event's CreatedAt), From (Config.From),
// To, Subject (RFC 2047 encoded when not ASCII), Message-ID <ID@domain> where
// ID is the event id and domain the From address's domain, MIME-Version,
// Auto-Submitted: auto-generated, and X-Herald-Event-Id, X-Herald-Topic and
// (when the event has a key) X-Herald-Key. Bodies are quoted-printable UTF-8.
// The route's destination is not used: recipients come from the payload.
//
// # Delivery
//
// Publish sends the events one at a time, a key's events in slice order,
// over one SMTP connection that it keeps open across calls (concurrent calls
// take turns on it) and reopens when the server has closed it. It reports
// one result per event, as soon as the server answered it
// (sinks.WithResultFunc):
//
//   - a payload the sink cannot turn into an email (not a JSON object, no or
//     an invalid recipient, no subject or template and no default, an
//     unknown template, a template failing on the payload), a message over
//     the server's advertised SIZE (sinks.TooLarge), or a 5xx refusal of a
//     recipient or of the message: sinks.Permanent, naming the event and
//     the field or the server's reply;
//   - a 4xx refusal, a connection lost while sending: a plain (retryable)
//     error;
//   - a server out of reach — connection refused, DNS, timeout, TLS
//     handshake or certificate, STARTTLS required but not offered,
//     authentication refused or required (530, 534, 535, 538, 454), a 5xx
//     refusal of the configured sender, 421 on connecting:
//     sinks.Unavailable, for this event and the rest of the call.
//
// Once an event of a key fails, the later events of that key in the same
// call are not sent and report sinks.ErrSkipped. After a refusal the sink
// resets the transaction (RSET) and goes on with the next event on the same
// connection.
//
// Delivery is at least once: if the connection breaks after the message's
// final dot but before the server's answer, the event is retried and the
// recipient may get the email twice. Message-ID is the same on every attempt,
// so mail stores and clients that deduplicate by Message-ID show one copy.
//
// # Security
//
// TLS defaults to STARTTLS, required (never skipped because the server does
// not offer it), except for localhost and loopback addresses, where it
// defaults to none so that a local relay or test server (MailHog, Mailpit)
// works with `smtp: {host: localhost, port: 1025}`. "implicit" speaks TLS
// from the first byte (SMTPS, port 465). AUTH PLAIN is used when a username
// is set; the config refuses to send a password without TLS to a host that
// is not loopback. The password is a sinkconfig.Secret and never appears in
// errors or logs.
package email
