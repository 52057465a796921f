package email

import (
	"bytes"
	"encoding/json"
	"fmt"
	htmltemplate "html/template"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	texttemplate "text/template"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// templates holds every body template of TemplatesDir, by name (the file
// name without its .txt or .html extension).
type templates struct {
	text  *texttemplate.Template
	html  *htmltemplate.Template
	names map[string]bool
}

// loadTemplates parses every .txt and .html file of dir. Errors name
// templates_dir and the file.
func loadTemplates(dir string) (*templates, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("templates_dir: %w", err)
	}
	t := &templates{
		text:  texttemplate.New("").Option("missingkey=error"),
		html:  htmltemplate.New("").Option("missingkey=error"),
		names: map[string]bool{},
	}
	for _, entry := range entries {
		ext := filepath.Ext(entry.Name())
		if entry.IsDir() || ext != ".txt" && ext != ".html" {
			continue
		}
		path := filepath.Join(dir, entry.Name())
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("templates_dir: %w", err)
		}
		if ext == ".txt" {
			_, err = t.text.New(entry.Name()).Parse(string(src))
		} else {
			_, err = t.html.New(entry.Name()).Parse(string(src))
		}
		if err != nil {
			return nil, fmt.Errorf("templates_dir: parsing %s: %w", path, err)
		}
		t.names[strings.TrimSuffix(entry.Name(), ext)] = true
	}
	if len(t.names) == 0 {
		return nil, fmt.Errorf("templates_dir: %s holds no .txt or .html template", dir)
	}
	return t, nil
}

// message is one rendered email with its envelope.
type message struct {
	to   []string // envelope recipients
	utf8 bool     // an envelope address needs SMTPUTF8
	data []byte
}

// EventData is what templates see as .Event, next to the payload's own
// top-level fields.
type EventData struct {
	ID        string
	Topic     string
	Key       string
	CreatedAt time.Time
	Headers   map[string]string
}

// render builds e's message. Every error is permanent: rendering the same
// event again gives the same result.
func (s *Sink) render(e sinks.Event) (*message, error) {
	fail := func(format string, args ...any) error {
		return sinks.Permanent(fmt.Errorf(format, args...))
	}
	if !sinks.IsJSON(e.ContentType) {
		return nil, fail("content type %q is not JSON: the email sink needs a JSON object payload", e.ContentType)
	}
	dec := json.NewDecoder(bytes.NewReader(e.Payload))
	dec.UseNumber() // render numbers as written: 12.50 stays 12.50
	var data map[string]any
	if err := dec.Decode(&data); err != nil {
		if bad := sinkconfig.CheckJSON(e.Payload); bad != nil {
			return nil, fail("%w", bad) // says why: syntax, or nesting too deep
		}
		return nil, fail("payload is not a JSON object: %w", err)
	}
	if data == nil {
		return nil, fail("payload is not a JSON object: null")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fail("payload is not a single JSON object: data after the object")
	}

	rcpts, err := recipients(data, s.cfg.ToField)
	if err != nil {
		return nil, fail("%w", err)
	}
	subject, err := stringField(data, s.cfg.SubjectField, s.cfg.Subject, "subject")
	if err != nil {
		return nil, fail("%w", err)
	}
	name, err := stringField(data, s.cfg.TemplateField, s.cfg.Template, "template")
	if err != nil {
		return nil, fail("%w", err)
	}
	if !s.tmpl.names[name] {
		return nil, fail("payload field %q: no template %q (%s.txt or %s.html) in templates_dir", s.cfg.TemplateField, name, name, name)
	}

	data["Event"] = EventData{ID: e.ID, Topic: e.Topic, Key: e.Key, CreatedAt: e.CreatedAt, Headers: e.Headers}
	var text, html bytes.Buffer
	hasText, hasHTML := s.tmpl.text.Lookup(name+".txt") != nil, s.tmpl.html.Lookup(name+".html") != nil
	if hasText {
		if err := s.tmpl.text.ExecuteTemplate(&text, name+".txt", data); err != nil {
			return nil, fail("rendering %s.txt: %w", name, err)
		}
	}
	if hasHTML {
		if err := s.tmpl.html.ExecuteTemplate(&html, name+".html", data); err != nil {
			return nil, fail("rendering %s.html: %w", name, err)
		}
	}

	m := &message{to: make([]string, len(rcpts))}
	var b bytes.Buffer
	b.Grow(512 + 2*(text.Len()+html.Len()))
	date := e.CreatedAt
	if date.IsZero() {
		date = time.Now()
	}
	header(&b, "Date", date.Format(time.RFC1123Z))
	header(&b, "From", s.from.String())
	b.WriteString("To: ")
	for i, a := range rcpts {
		if i > 0 {
			b.WriteString(",\r\n ")
		}
		b.WriteString(a.String())
		m.to[i] = a.Address
		m.utf8 = m.utf8 || !isASCII(a.Address)
	}
	b.WriteString("\r\n")
	header(&b, "Subject", fold(mime.QEncoding.Encode("utf-8", subject), len("Subject: ")))
	header(&b, "Message-ID", "<"+e.ID+"@"+s.domain+">")
	header(&b, "MIME-Version", "1.0")
	header(&b, "Auto-Submitted", "auto-generated")
	header(&b, "X-Herald-Event-Id", e.ID)
	header(&b, "X-Herald-Topic", mime.QEncoding.Encode("utf-8", e.Topic))
	if e.Key != "" {
		header(&b, "X-Herald-Key", mime.QEncoding.Encode("utf-8", e.Key))
	}
	switch {
	case hasText && hasHTML:
		mw := multipart.NewWriter(&b)
		header(&b, "Content-Type", "multipart/alternative;\r\n boundary=\""+mw.Boundary()+"\"")
		b.WriteString("\r\n")
		for _, part := range []struct {
			mediaType string
			body      []byte
		}{{"text/plain", text.Bytes()}, {"text/html", html.Bytes()}} {
			w, err := mw.CreatePart(textproto.MIMEHeader{
				"Content-Type":              {part.mediaType + "; charset=utf-8"},
				"Content-Transfer-Encoding": {"quoted-printable"},
			})
			if err == nil {
				err = writeQP(w, part.body)
			}
			if err != nil {
				return nil, fail("writing the %s part: %w", part.mediaType, err)
			}
		}
		if err := mw.Close(); err != nil {
			return nil, fail("closing the multipart body: %w", err)
		}
	case hasText:
		singlePart(&b, "text/plain", text.Bytes())
	default:
		singlePart(&b, "text/html", html.Bytes())
	}
	if !bytes.HasSuffix(b.Bytes(), []byte("\r\n")) {
		b.WriteString("\r\n")
	}
	m.data = b.Bytes()
	return m, nil
}

func header(b *bytes.Buffer, name, value string) {
	b.WriteString(name)
	b.WriteString(": ")
	b.WriteString(value)
	b.WriteString("\r\n")
}

// fold breaks a header value at spaces so that lines stay within 78
// characters where the value allows it (RFC 5322 section 2.2.3); used is the
// length of the line's start ("Subject: ").
func fold(value string, used int) string {
	if used+len(value) <= 78 {
		return value
	}
	var b strings.Builder
	line := used
	for i, word := range strings.Split(value, " ") {
		if i > 0 {
			if line+1+len(word) > 78 {
				b.WriteString("\r\n")
				line = 0
			}
			b.WriteByte(' ')
			line++
		}
		b.WriteString(word)
		line += len(word)
	}
	return b.String()
}

func singlePart(b *bytes.Buffer, mediaType string, body []byte) {
	header(b, "Content-Type", mediaType+"; charset=utf-8")
	header(b, "Content-Transfer-Encoding", "quoted-printable")
	b.WriteString("\r\n")
	_ = writeQP(b, body) // a bytes.Buffer does not fail
}

func writeQP(w io.Writer, body []byte) error {
	qp := quotedprintable.NewWriter(w)
	if _, err := qp.Write(body); err != nil {
		return err
	}
	return qp.Close()
}

// lookup walks a dotted path through nested JSON objects.
func lookup(data map[string]any, path string) (any, bool) {
	var cur any = data
	for part := range strings.SplitSeq(path, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = obj[part]; !ok {
			return nil, false
		}
	}
	return cur, cur != nil
}

// stringField returns the string at path, or def when the payload has none.
// what names the value for the error when neither exists.
func stringField(data map[string]any, path, def, what string) (string, error) {
	v, ok := lookup(data, path)
	if !ok {
		if def == "" {
			return "", fmt.Errorf("payload has no field %q and no default %s is configured", path, what)
		}
		return def, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("payload field %q: want a string, got %s", path, jsonKind(v))
	}
	return s, nil
}

// recipients parses the address or addresses at path.
func recipients(data map[string]any, path string) ([]*mail.Address, error) {
	v, ok := lookup(data, path)
	if !ok {
		return nil, fmt.Errorf("payload has no recipient field %q", path)
	}
	var list []*mail.Address
	switch v := v.(type) {
	case string:
		addrs, err := mail.ParseAddressList(v)
		if err != nil {
			return nil, fmt.Errorf("payload field %q: %q is not a valid address list: %w", path, v, err)
		}
		list = addrs
	case []any:
		for i, item := range v {
			s, ok := item.(string)
			if !ok {
				return nil, fmt.Errorf("payload field %q[%d]: want a string, got %s", path, i, jsonKind(item))
			}
			a, err := mail.ParseAddress(s)
			if err != nil {
				return nil, fmt.Errorf("payload field %q[%d]: %q is not a valid address: %w", path, i, s, err)
			}
			list = append(list, a)
		}
	default:
		return nil, fmt.Errorf("payload field %q: want an address string or an array of them, got %s", path, jsonKind(v))
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("payload field %q: no recipient", path)
	}
	return list, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
