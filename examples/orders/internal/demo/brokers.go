package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"

	"github.com/heraldhq/herald/internal/relayconfig"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/mqtt"
	"github.com/heraldhq/herald/sinks/rabbitmq"
	"github.com/heraldhq/herald/sinks/redis"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// Sinks the demo adds on request (Options.Brokers). Redis, RabbitMQ and
// MQTT servers cannot run inside the demo's process, so the demo uses
// servers already running and fails, naming the server, when one does not
// answer. Pub/Sub runs in the process (Google's pstest fake); SQS and SNS
// need moto_server, which the demo starts (or Options.AWSEndpoint).
const (
	SinkRedis    = "redis"
	SinkRabbitMQ = "rabbitmq"
	SinkMQTT     = "mqtt"
	SinkPubSub   = "pubsub"
	SinkSQS      = "sqs"
	SinkSNS      = "sns"
)

// BrokerSinks are the values Options.Brokers accepts, in the order their
// sinks are added.
var BrokerSinks = []string{SinkRedis, SinkRabbitMQ, SinkMQTT, SinkPubSub, SinkSQS, SinkSNS}

// The servers Options.Brokers uses when their URL is not set.
const (
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultMQTTURL     = "mqtt://127.0.0.1:1883"
)

// brokerPeer is a sink whose server runs outside the demo, with a consumer
// of the demo's own reading what the sink delivered there.
type brokerPeer struct {
	name        string
	sink        sinks.Sink
	destination *template.Template
	got         *arrivals
	close       func()
}

// startBroker connects a consumer for the named sink and creates the
// sink, publishing where the consumer reads: a stream, a queue or a topic
// named after run, which is unique to this run.
func (d *run) startBroker(ctx context.Context, name string, run string) (*brokerPeer, error) {
	var (
		p   *brokerPeer
		err error
		o   = d.opts
	)
	switch name {
	case SinkRedis:
		p, err = startRedis(ctx, o, run)
	case SinkRabbitMQ:
		p, err = startRabbitMQ(o, run)
	case SinkMQTT:
		p, err = startMQTT(ctx, o, run)
	case SinkPubSub:
		p, err = startPubSub(ctx, o, run)
	case SinkSQS:
		p, err = d.startSQS(ctx, run)
	case SinkSNS:
		p, err = d.startSNS(ctx, run)
	default:
		return nil, fmt.Errorf("sinks: unknown sink %q (known: %s)", name, strings.Join(BrokerSinks, ", "))
	}
	if err != nil {
		return nil, fmt.Errorf("%s sink: %w (start the server or leave %s out of the demo's sinks)", name, err, name)
	}
	return p, nil
}

// startRedis reads the stream herald_demo:<run>:orders with XREAD and
// deletes it at the end.
func startRedis(ctx context.Context, o Options, run string) (*brokerPeer, error) {
	opts, err := goredis.ParseURL(o.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %s", relayconfig.ScrubPassword(err.Error(), o.RedisURL))
	}
	client := goredis.NewClient(opts)
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := client.Ping(pingCtx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("no Redis at %s: %w", relayconfig.RedactURL(o.RedisURL), err)
	}
	stream := "herald_demo:" + run + ":orders"
	got := newArrivals()
	readCtx, stopReading := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := "0"
		for readCtx.Err() == nil {
			res, err := client.XRead(readCtx, &goredis.XReadArgs{Streams: []string{stream, last}, Block: time.Second, Count: 1000}).Result()
			if err != nil {
				if !errors.Is(err, goredis.Nil) && readCtx.Err() == nil {
					time.Sleep(100 * time.Millisecond) // the server went away; try again
				}
				continue
			}
			now := time.Now()
			for _, s := range res {
				for _, m := range s.Messages {
					if id, ok := m.Values["id"].(string); ok {
						got.add(id, now)
					}
					last = m.ID
				}
			}
		}
	}()
	sink, err := redis.New(SinkRedis, redis.Config{URL: o.RedisURL}, o.Logger)
	if err != nil {
		stopReading()
		<-done
		client.Close()
		return nil, err
	}
	return &brokerPeer{name: SinkRedis, sink: sink, got: got,
		destination: template.Must(template.New(SinkRedis).Parse(stream)),
		close: func() {
			stopReading()
			<-done
			delCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = client.Del(delCtx, stream).Err()
			client.Close()
		}}, nil
}

// startRabbitMQ declares an exclusive queue herald_demo.<run> (RabbitMQ
// deletes it with the consumer's connection) and consumes it; the sink
// publishes to it through the default exchange.
func startRabbitMQ(o Options, run string) (*brokerPeer, error) {
	conn, err := amqp.DialConfig(o.RabbitMQURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("no RabbitMQ at %s: %s", relayconfig.RedactURL(o.RabbitMQURL), relayconfig.ScrubPassword(err.Error(), o.RabbitMQURL))
	}
	queue := "herald_demo." + run
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(queue, false, false, true, false, nil)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(queue, "", true, true, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("declaring and consuming queue %s: %w", queue, err)
	}
	got := newArrivals()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			got.add(d.MessageId, time.Now())
		}
	}()
	sink, err := rabbitmq.New(SinkRabbitMQ, rabbitmq.Config{URL: sinkconfig.Secret(o.RabbitMQURL)}, o.Logger)
	if err != nil {
		conn.Close()
		<-done
		return nil, err
	}
	return &brokerPeer{name: SinkRabbitMQ, sink: sink, got: got,
		destination: template.Must(template.New(SinkRabbitMQ).Parse(queue)),
		close:       func() { conn.Close(); <-done }}, nil
}

// startMQTT subscribes with QoS 1 to herald-demo/<run>/#; the sink
// publishes each event under it, at its topic.
func startMQTT(ctx context.Context, o Options, run string) (*brokerPeer, error) {
	addr := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(o.MQTTURL, "mqtt://"), "tcp://"), "/")
	if strings.Contains(addr, "@") || strings.Contains(addr, "://") {
		return nil, fmt.Errorf("mqtt url: %s: the demo subscribes anonymously over mqtt:// (host:port only)", relayconfig.RedactURL(o.MQTTURL))
	}
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("no MQTT broker at %s: %w", o.MQTTURL, err)
	}
	got := newArrivals()
	client := paho.NewClient(paho.ClientConfig{Conn: nc, OnPublishReceived: []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			if props := pr.Packet.Properties; props != nil {
				if id := props.User.Get(mqtt.PropertyID); id != "" {
					got.add(id, time.Now())
				}
			}
			return true, nil
		}}})
	connCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	prefix := "herald-demo/" + run
	if _, err := client.Connect(connCtx, &paho.Connect{ClientID: "herald-demo-" + run, CleanStart: true, KeepAlive: 30}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("connecting to %s: %w", o.MQTTURL, err)
	}
	if _, err := client.Subscribe(connCtx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: prefix + "/#", QoS: 1}}}); err != nil {
		_ = client.Disconnect(&paho.Disconnect{})
		return nil, fmt.Errorf("subscribing to %s/#: %w", prefix, err)
	}
	sink, err := mqtt.New(SinkMQTT, mqtt.Config{URL: o.MQTTURL}, o.Logger)
	if err != nil {
		_ = client.Disconnect(&paho.Disconnect{})
		return nil, err
	}
	return &brokerPeer{name: SinkMQTT, sink: sink, got: got,
		destination: template.Must(template.New(SinkMQTT).Parse(prefix + "/{{.Topic}}")),
		close:       func() { _ = client.Disconnect(&paho.Disconnect{}) }}, nil
}

// validateBrokers checks Options.Brokers: known names, each once.
func validateBrokers(names []string) error {
	for i, name := range names {
		if !slices.Contains(BrokerSinks, name) {
			return fmt.Errorf("sinks: unknown sink %q (known: %s)", name, strings.Join(BrokerSinks, ", "))
		}
		if slices.Contains(names[:i], name) {
			return fmt.Errorf("sinks: %s named twice", name)
		}
	}
	return nil
}

// newRunID is the part of stream, queue and topic names unique to a run.
func newRunID() string { return strings.ReplaceAll(uuid.NewString(), "-", "")[:12] }
