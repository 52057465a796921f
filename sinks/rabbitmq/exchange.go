package rabbitmq

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/template"
	"text/template/parse"

	"github.com/heraldhq/herald/sinks"
)

// exchangeData is what the exchange template sees: the fields a route's
// destination template sees (relay.DestinationData), so that one template
// language serves both halves of an AMQP address.
type exchangeData struct {
	ID, Topic, Key string
	Headers        map[string]string
}

// sampleExchangeData is the event the template is tried on when the
// configuration is validated, to catch misspelt fields before any event.
var sampleExchangeData = exchangeData{
	ID: "00000000-0000-0000-0000-000000000000", Topic: "topic", Key: "key", Headers: map[string]string{},
}

// exchangeTemplate is the parsed exchange setting: a fixed name, or a
// template rendered per event.
type exchangeTemplate struct {
	// fixed is the exchange when the setting has no template actions.
	fixed string
	// tmpl renders the exchange from the event; nil when fixed serves.
	tmpl *template.Template
}

// parseExchange parses the exchange setting. Errors start with "exchange:".
func parseExchange(text string) (exchangeTemplate, error) {
	tmpl, err := template.New("exchange").Option("missingkey=error").Parse(text)
	if err != nil {
		return exchangeTemplate{}, fmt.Errorf("exchange: invalid template: %w", err)
	}
	if fixed, ok := literal(tmpl); ok {
		if len(fixed) > maxShortString {
			return exchangeTemplate{}, fmt.Errorf("exchange: %d bytes, over AMQP's limit of %d", len(fixed), maxShortString)
		}
		return exchangeTemplate{fixed: fixed}, nil
	}
	// A header missing from the sample is not a mistake in the template;
	// every other failure (an unknown field, a bad call) would fail every
	// event.
	if err := tmpl.Execute(io.Discard, sampleExchangeData); err != nil && !strings.Contains(err.Error(), "map has no entry for key") {
		return exchangeTemplate{}, fmt.Errorf("exchange: invalid template (fields are .ID, .Topic, .Key, .Headers): %w", err)
	}
	return exchangeTemplate{tmpl: tmpl}, nil
}

// literal returns the text of a template without actions.
func literal(tmpl *template.Template) (string, bool) {
	if tmpl.Tree == nil {
		return "", true
	}
	var b strings.Builder
	for _, n := range tmpl.Tree.Root.Nodes {
		text, ok := n.(*parse.TextNode)
		if !ok {
			return "", false
		}
		b.Write(text.Text)
	}
	return b.String(), true
}

// templated reports whether the exchange depends on the event.
func (x exchangeTemplate) templated() bool { return x.tmpl != nil }

// render returns the exchange for e. A template that fails on the event (a
// header it names is missing) or renders a name AMQP cannot carry fails
// the event permanently: retrying renders the same.
func (x exchangeTemplate) render(e sinks.Event, buf *bytes.Buffer) (string, error) {
	if x.tmpl == nil {
		return x.fixed, nil
	}
	buf.Reset()
	if err := x.tmpl.Execute(buf, exchangeData{ID: e.ID, Topic: e.Topic, Key: e.Key, Headers: e.Headers}); err != nil {
		return "", sinks.Permanent(fmt.Errorf("rendering the exchange: %w", err))
	}
	if buf.Len() > maxShortString {
		return "", sinks.Permanent(fmt.Errorf("exchange %.40q… is %d bytes, over AMQP's limit of %d", buf.String(), buf.Len(), maxShortString))
	}
	return buf.String(), nil
}
