package mqtt_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/mqtttest"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/mqtt"
	"github.com/heraldhq/herald/sinks/sinktest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	var subs sync.Map // destination → *mqtttest.Subscriber
	sinktest.Run(t, sinktest.Harness{
		NewSink: func(t *testing.T, destination string) sinks.Sink {
			subs.Store(destination, mqtttest.Subscribe(t, url, destination))
			s, err := mqtt.New("conformance", mqtt.Config{URL: url}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Unreachable: func(t *testing.T, destination string) sinks.Sink {
			s, err := mqtt.New("conformance", mqtt.Config{URL: "mqtt://" + sinktest.ClosedAddr(t)}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Received: func(t *testing.T, destination string) []sinktest.Received {
			v, ok := subs.Load(destination)
			if !ok {
				t.Fatalf("no subscriber for %s", destination)
			}
			var out []sinktest.Received
			for _, m := range v.(*mqtttest.Subscriber).Messages() {
				out = append(out, sinktest.Received{ID: m.User[mqtt.PropertyID], Key: m.User[mqtt.PropertyKey],
					Destination: m.Topic, Payload: m.Payload, Headers: m.User})
			}
			return out
		},
		Refused: func(destination, key string) sinks.Event {
			return sinktest.Event(destination+"/+", key, []byte(`{}`)) // a wildcard: not a topic name
		},
		Features: sinktest.Features{Headers: true, Binary: true, Keys: true, ReportsEarly: true},
		Timeout:  30 * time.Second,
	})
}

func TestMessageProperties(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	p := mqtttest.Prefix()
	sub := mqtttest.Subscribe(t, url, p+"/#")
	s := open(t, mqtt.Config{URL: url})
	var events []sinks.Event
	for i := range 60 { // more than Mosquitto's default in-flight window of 20
		key := fmt.Sprintf("k%d", i%3)
		if i%10 == 0 {
			key = ""
		}
		e := sinktest.Event(p+"/orders", key, fmt.Appendf(nil, `{"n":%d}`, i))
		e.Topic = "orders.created"
		e.Headers = map[string]string{"x-n": fmt.Sprint(i), "herald-id": "spoofed"}
		events = append(events, e)
	}
	bin := sinktest.Event(p+"/bin", "", []byte{0xff, 0x00})
	bin.ContentType = "application/octet-stream"
	events = append(events, bin)
	for i, err := range publish(t, s, events...) {
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	got := sub.WaitFor(t, len(events), 30*time.Second)
	for i, m := range got {
		e := events[i] // one connection, QoS 1: the broker forwards in send order
		if m.User[mqtt.PropertyID] != e.ID || m.Topic != e.Destination || string(m.Payload) != string(e.Payload) {
			t.Fatalf("message %d: id %q topic %s payload %q, want %s %s %q", i, m.User[mqtt.PropertyID], m.Topic, m.Payload, e.ID, e.Destination, e.Payload)
		}
		if m.ContentType != e.ContentType {
			t.Fatalf("message %d: content type %q, want %q", i, m.ContentType, e.ContentType)
		}
		json := sinks.IsJSON(e.ContentType)
		if json && (m.PayloadFormat == nil || *m.PayloadFormat != 1) || !json && m.PayloadFormat != nil {
			t.Fatalf("message %d (%s): payload format indicator %v", i, e.ContentType, m.PayloadFormat)
		}
		if e.Headers != nil && (m.User["x-n"] != e.Headers["x-n"] || m.User[mqtt.PropertyTopic] != "orders.created") {
			t.Fatalf("message %d: user properties %v", i, m.User)
		}
		if _, ok := m.User["herald-id"]; ok {
			t.Fatalf("message %d: an event header spoofing %s travelled: %v", i, mqtt.PropertyID, m.User)
		}
		if k, ok := m.User[mqtt.PropertyKey]; e.Key == "" && ok || e.Key != "" && k != e.Key {
			t.Fatalf("message %d: %s = %q (present %v), want %q", i, mqtt.PropertyKey, k, ok, e.Key)
		}
	}
}

func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	p := mqtttest.Prefix()
	sub := mqtttest.Subscribe(t, url, p+"/#")
	s := open(t, mqtt.Config{URL: url})
	events := []sinks.Event{
		sinktest.Event(p+"/+", "w", []byte(`{}`)),
		sinktest.Event(p+"/#", "", []byte(`{}`)),
		sinktest.Event("$SYS/"+p, "", []byte(`{}`)),
		sinktest.Event("", "", []byte(`{}`)),
		sinktest.Event(p+"/ok", "b", []byte(`{}`)),
	}
	errs := publish(t, s, events...)
	for i := range 4 {
		if !sinks.IsPermanent(errs[i]) {
			t.Errorf("event %d (%q): %v, want permanent", i, events[i].Destination, errs[i])
		}
	}
	if errs[4] != nil {
		t.Fatalf("valid event: %v", errs[4])
	}
	got := sub.WaitFor(t, 1, 30*time.Second)
	if got[0].User[mqtt.PropertyID] != events[4].ID {
		t.Fatalf("subscriber got %s first, want the valid event %s", got[0].User[mqtt.PropertyID], events[4].ID)
	}
}

func TestClosedPortIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s := open(t, mqtt.Config{URL: "mqtt://herald:hunter2@" + addr, ConnectTimeout: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = s.Check(ctx)
	if !sinks.IsUnavailable(err) {
		t.Fatalf("Check: %v, want Unavailable", err)
	}
	errs := publish(t, s, sinktest.Event("a/b", "k", []byte(`{}`)), sinktest.Event("a/b", "k", []byte(`{}`)))
	for i, err := range append(errs, err) {
		if !sinks.IsUnavailable(err) {
			t.Fatalf("result %d: %v, want Unavailable", i, err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("result %d shows the password: %v", i, err)
		}
	}
}

func TestPrivateBrokerSetupErrors(t *testing.T) {
	t.Parallel()
	url := privateBroker(t)
	t.Run("bad password is Unavailable", func(t *testing.T) {
		s := open(t, mqtt.Config{URL: url, Username: "herald", Password: "wrong-pw"})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := s.Check(ctx)
		var reason *mqtt.ReasonError
		if !sinks.IsUnavailable(err) || !errors.As(err, &reason) || reason.Packet != "CONNACK" || reason.Code != 0x86 && reason.Code != 0x87 {
			// Mosquitto answers a bad password with 0x87 (not authorized).
			t.Fatalf("Check: %v, want Unavailable CONNACK 0x86 or 0x87", err)
		}
		if strings.Contains(err.Error(), "wrong-pw") {
			t.Fatalf("error shows the password: %v", err)
		}
		errs := publish(t, s, sinktest.Event("allowed/x", "", []byte(`{}`)))
		if !sinks.IsUnavailable(errs[0]) {
			t.Fatalf("Publish: %v, want Unavailable", errs[0])
		}
	})
	t.Run("ACL refusal is Unavailable, packet too large is permanent", func(t *testing.T) {
		s := open(t, mqtt.Config{URL: strings.Replace(url, "mqtt://", "mqtt://herald:s3cret@", 1)})
		big := sinktest.Oversized("allowed/big", "", 8000) // over max_packet_size 4096
		// The denied event comes last: an Unavailable answer stops the
		// call, and the events after it would get that answer instead of
		// their own, depending on when its PUBACK arrives.
		events := []sinks.Event{
			sinktest.Event("allowed/ok", "a", []byte(`{}`)),
			big,
			sinktest.Event("denied/x", "b", []byte(`{}`)),
		}
		errs := publish(t, s, events...)
		if errs[0] != nil {
			t.Fatalf("allowed topic: %v", errs[0])
		}
		if !sinks.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "4096") {
			t.Fatalf("oversized event: %v, want permanent naming the broker's limit", errs[1])
		}
		var reason *mqtt.ReasonError
		if !sinks.IsUnavailable(errs[2]) || !errors.As(errs[2], &reason) || reason.Code != 0x87 {
			t.Fatalf("denied topic: %v, want Unavailable PUBACK 0x87", errs[2])
		}
	})
}

func TestNoPubackIsRetryable(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	px := startProxy(t, url)
	s := open(t, mqtt.Config{URL: px.url(), AckTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	px.muted.Store(true) // the broker's PUBACKs no longer reach the sink
	errs := publish(t, s, sinktest.Event(mqtttest.Prefix()+"/x", "k", []byte(`{}`)))
	if errs[0] == nil || sinks.IsPermanent(errs[0]) || sinks.IsUnavailable(errs[0]) || !strings.Contains(errs[0].Error(), "ack_timeout") {
		t.Fatalf("no PUBACK: %v, want a retryable ack_timeout error", errs[0])
	}
}

func TestReconnectsAfterConnectionDrops(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	p := mqtttest.Prefix()
	sub := mqtttest.Subscribe(t, url, p+"/#")
	px := startProxy(t, url)
	s := open(t, mqtt.Config{URL: px.url()})
	first := sinktest.Event(p+"/a", "k", []byte(`{"n":1}`))
	if errs := publish(t, s, first); errs[0] != nil {
		t.Fatalf("before the drop: %v", errs[0])
	}
	px.cut()
	// The relay retries an Unavailable sink; so does this loop, until the
	// sink publishes through a new connection.
	second := sinktest.Event(p+"/a", "k", []byte(`{"n":2}`))
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := publish(t, s, second)[0]
		if err == nil {
			break
		}
		if !sinks.IsUnavailable(err) {
			t.Fatalf("after the drop: %v, want Unavailable until reconnected", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful publish within 60s of the drop: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := px.accepted.Load(); n < 2 {
		t.Fatalf("proxy accepted %d connections, want a second one", n)
	}
	got := sub.WaitFor(t, 2, 30*time.Second)
	if got[len(got)-1].User[mqtt.PropertyID] != second.ID {
		t.Fatalf("last message %s, want %s", got[len(got)-1].User[mqtt.PropertyID], second.ID)
	}
}

func TestCheckDestinations(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	s := open(t, mqtt.Config{URL: url})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.CheckDestinations(ctx, "orders/created", "a/b/c"); err != nil {
		t.Fatalf("valid topics: %v", err)
	}
	err := s.CheckDestinations(ctx, "orders/+", "ok", "$SYS/x")
	if err == nil || !strings.Contains(err.Error(), `"orders/+"`) || !strings.Contains(err.Error(), `"$SYS/x"`) {
		t.Fatalf("CheckDestinations: %v, want both bad topics named", err)
	}
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	url := mqtttest.URL(t)
	s, err := mqtt.New("test", mqtt.Config{URL: url}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	errs := s.Publish(ctx, []sinks.Event{sinktest.Event("a/b", "", []byte(`{}`))})
	if !errors.Is(errs[0], mqtt.ErrClosed) || !sinks.IsUnavailable(errs[0]) {
		t.Fatalf("after Close: %v, want Unavailable ErrClosed", errs[0])
	}
}
