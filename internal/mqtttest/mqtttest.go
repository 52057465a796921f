// Package mqtttest is test support for code that talks to MQTT: the URL of
// the shared broker (skipping or failing when it is down) and a subscriber
// that collects what the broker delivers on a topic filter.
//
// Tests share one broker and run in parallel across packages, so each test
// publishes under a topic prefix of its own (Prefix).
package mqtttest

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/heraldhq/herald/internal/localpeer"
)

// DefaultURL is the shared broker's URL when MQTT_URL is not set.
const DefaultURL = "mqtt://127.0.0.1:1883"

// URL returns the shared broker's URL: $MQTT_URL, or DefaultURL. When
// nothing answers there, the test fails if CI=true and is skipped
// otherwise, saying what to start.
func URL(t testing.TB) string {
	t.Helper()
	return broker.URL(t)
}

var broker = localpeer.Service{Name: "MQTT broker", Env: "MQTT_URL", Default: DefaultURL,
	Start: "mosquitto -d -c /etc/mosquitto/mosquitto.conf"}

// Addr returns the host:port of an mqtt:// or tcp:// URL without user
// information.
func Addr(url string) string {
	addr := strings.TrimPrefix(strings.TrimPrefix(url, "mqtt://"), "tcp://")
	if i := strings.LastIndex(addr, "@"); i >= 0 {
		addr = addr[i+1:]
	}
	return strings.TrimSuffix(addr, "/")
}

// Prefix returns a topic prefix unique to the caller.
func Prefix() string { return "herald-test/" + uuid.NewString()[:8] }

// Message is one message a Subscriber received.
type Message struct {
	Topic       string
	Payload     []byte
	ContentType string
	// PayloadFormat is the payload format indicator, nil when absent.
	PayloadFormat *byte
	// User holds the user properties (the last value of a repeated name).
	User map[string]string
}

// Subscriber collects, in arrival order, what the broker delivers for a
// topic filter, subscribed with QoS 1 (so that order and delivery hold).
type Subscriber struct {
	mu   sync.Mutex
	msgs []Message
}

// Subscribe connects a subscriber to url for filter; it disconnects in
// cleanup.
func Subscribe(t testing.TB, url, filter string) *Subscriber {
	t.Helper()
	nc, err := net.DialTimeout("tcp", Addr(url), 5*time.Second)
	if err != nil {
		t.Fatalf("mqtttest: dialling %s: %v", Addr(url), err)
	}
	sub := &Subscriber{}
	client := paho.NewClient(paho.ClientConfig{Conn: nc, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			m := Message{Topic: pr.Packet.Topic, Payload: pr.Packet.Payload, User: map[string]string{}}
			if p := pr.Packet.Properties; p != nil {
				m.ContentType, m.PayloadFormat = p.ContentType, p.PayloadFormat
				for _, u := range p.User {
					m.User[u.Key] = u.Value
				}
			}
			sub.mu.Lock()
			sub.msgs = append(sub.msgs, m)
			sub.mu.Unlock()
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Connect(ctx, &paho.Connect{ClientID: "herald-test-sub-" + uuid.NewString()[:8], CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatalf("mqtttest: connecting to %s: %v", Addr(url), err)
	}
	t.Cleanup(func() { _ = client.Disconnect(&paho.Disconnect{}) })
	if _, err := client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatalf("mqtttest: subscribing to %s: %v", filter, err)
	}
	return sub
}

// Messages returns what arrived so far.
func (s *Subscriber) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

// WaitFor polls until n messages arrived, failing the test after timeout.
func (s *Subscriber) WaitFor(t testing.TB, n int, timeout time.Duration) []Message {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := s.Messages()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("mqtttest: subscriber received %d messages, want %d", len(got), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
