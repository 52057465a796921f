package rabbitmq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// TestExchangeTemplate: with exchange "<prefix>.{{.Topic}}.{{.Headers.region}}"
// each event goes to the exchange its topic and header name,
// here two exchanges each bound to a queue of its own; an event whose
// header the template needs is missing fails permanently, unsent.
func TestExchangeTemplate(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	prefix := uniqueName("herald_test_tx")
	queues := map[string]string{}
	for _, region := range []string{"eu", "us"} {
		exchange := prefix + ".orders." + region
		if err := b.ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.ch.ExchangeDelete(exchange, false, false) })
		q := b.queue(t, uniqueName("herald_test"), nil)
		if err := b.ch.QueueBind(q, "", exchange, false, nil); err != nil {
			t.Fatal(err)
		}
		queues[region] = q
	}
	s := open(t, rabbitmq.Config{URL: secret(u), Exchange: prefix + `.{{.Topic}}.{{.Headers.region}}`})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Nothing to check before an event renders an exchange.
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	event := func(region string) sinks.Event {
		e := sinktest.Event("orders", "k-"+region, []byte(`{}`))
		if region != "" {
			e.Headers = map[string]string{"region": region}
		}
		return e
	}
	eu1, us1, none, eu2 := event("eu"), event("us"), event(""), event("eu")
	errs := publish(t, s, eu1, us1, none, eu2)
	for _, i := range []int{0, 1, 3} {
		if errs[i] != nil {
			t.Fatalf("event %d: %v", i, errs[i])
		}
	}
	if !sinks.IsPermanent(errs[2]) || !strings.Contains(errs[2].Error(), "region") {
		t.Fatalf("event without the header: %v, want a permanent error naming the missing header", errs[2])
	}
	for region, want := range map[string][]string{"eu": {eu1.ID, eu2.ID}, "us": {us1.ID}} {
		got := b.waitMessages(t, queues[region], len(want))
		if len(got) != len(want) {
			t.Fatalf("%s queue got %d messages, want %d", region, len(got), len(want))
		}
		for i, d := range got {
			if d.MessageId != want[i] || d.Exchange != prefix+".orders."+region {
				t.Fatalf("%s queue message %d: %s from %q, want %s from %s.orders.%s", region, i, d.MessageId, d.Exchange, want[i], prefix, region)
			}
		}
	}
}

// TestExchangeTemplateMissingExchange: an event rendering an exchange that
// does not exist fails as Unavailable naming that exchange (the relay
// pauses the sink), and Check names it from then on, until it exists.
func TestExchangeTemplateMissingExchange(t *testing.T) {
	t.Parallel()
	u := brokerURL(t)
	b := newBroker(t, u)
	prefix := uniqueName("herald_test_tx")
	s := open(t, rabbitmq.Config{URL: secret(u), Exchange: prefix + `.{{.Headers.region}}`})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := sinktest.Event("orders", "k", []byte(`{}`))
	e.Headers = map[string]string{"region": "mars"}
	missing := prefix + ".mars"
	errs := publish(t, s, e)
	if !sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), `exchange "`+missing+`"`) {
		t.Fatalf("publish to a missing rendered exchange: %v, want Unavailable naming exchange %q", errs[0], missing)
	}
	if err := s.Check(ctx); !sinks.IsUnavailable(err) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Check after the failed publish: %v, want Unavailable naming %s", err, missing)
	}

	if err := b.ch.ExchangeDeclare(missing, amqp.ExchangeFanout, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.ch.ExchangeDelete(missing, false, false) })
	q := b.queue(t, uniqueName("herald_test"), nil)
	if err := b.ch.QueueBind(q, "", missing, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check once the exchange exists: %v", err)
	}
	publishOK(t, s, e)
	if got := b.waitMessages(t, q, 1); got[0].MessageId != e.ID {
		t.Fatalf("queue got %s, want %s", got[0].MessageId, e.ID)
	}
}

func TestExchangeTemplateValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ exchange, want string }{
		{"{{.Topic", "exchange: invalid template"},
		{"{{.Tenant}}", "exchange: invalid template (fields are .ID, .Topic, .Key, .Headers)"},
		{strings.Repeat("x", 256), "exchange: 256 bytes"},
	} {
		err := rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Exchange: c.exchange}.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("exchange %.20q: Validate: %v, want an error starting %q", c.exchange, err, c.want)
		}
	}
	// A header the sample event lacks is not a mistake.
	if err := (rabbitmq.Config{URL: "amqp://127.0.0.1/", Exchange: `{{index .Headers "tenant"}}`}).Validate(); err != nil {
		t.Fatalf("a template indexing a header: %v", err)
	}
}
