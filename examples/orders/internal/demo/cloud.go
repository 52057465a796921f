package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"text/template"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/heraldhq/herald/sinks/pubsub"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sns"
	"github.com/heraldhq/herald/sinks/sqs"
)

// startPubSub starts Google's in-process Pub/Sub fake (pstest) with a topic
// herald-demo-<run>; the sink reaches it as an emulator endpoint, and the
// demo reads back what it stored.
func startPubSub(ctx context.Context, o Options, run string) (*brokerPeer, error) {
	srv := pstest.NewServer()
	const project = "herald-demo"
	topic := "herald-demo-" + run
	if _, err := srv.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topic}); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("creating topic %s on the Pub/Sub fake: %w", topic, err)
	}
	got := newArrivals()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		// pstest offers no notification of a publish: poll what it stored
		// (publish order), noting the messages not seen yet.
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		seen := 0
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			msgs := srv.Messages()
			now := time.Now()
			for _, m := range msgs[seen:] {
				got.add(m.Attributes[pubsub.AttrID], now)
			}
			seen = len(msgs)
		}
	}()
	closeFake := func() { close(stop); <-done; _ = srv.Close() }
	sink, err := pubsub.New(SinkPubSub, pubsub.Config{Project: project, Endpoint: srv.Addr}, o.Logger)
	if err != nil {
		closeFake()
		return nil, err
	}
	return &brokerPeer{name: SinkPubSub, sink: sink, got: got,
		destination: template.Must(template.New(SinkPubSub).Parse(topic)),
		close:       closeFake}, nil
}

// The credentials the demo gives moto, which accepts any.
const (
	motoAccessKeyID     = "herald-demo"
	motoSecretAccessKey = "herald-demo-secret"
	motoRegion          = "us-east-1"
)

// awsServer is the SQS/SNS endpoint of a run: Options.AWSEndpoint, or a
// moto_server the demo started, shared by the sqs and sns sinks.
type awsServer struct {
	endpoint string
	cfg      aws.Config
}

// awsEndpoint returns the run's SQS/SNS endpoint, starting moto_server on
// the first call when Options.AWSEndpoint is unset.
func (d *run) awsEndpoint(ctx context.Context) (*awsServer, error) {
	if d.aws != nil {
		return d.aws, nil
	}
	endpoint := d.opts.AWSEndpoint
	if endpoint == "" {
		var stop func()
		var err error
		if endpoint, stop, err = startMoto(ctx); err != nil {
			return nil, err
		}
		d.addCloser(stop)
		d.note("demo: moto_server " + endpoint + " (SQS and SNS)")
	}
	d.aws = &awsServer{endpoint: endpoint, cfg: aws.Config{
		Region:           motoRegion,
		Credentials:      credentials.NewStaticCredentialsProvider(motoAccessKeyID, motoSecretAccessKey, ""),
		BaseEndpoint:     aws.String(endpoint),
		RetryMaxAttempts: 5, // moto closes idle connections; a retry gets a fresh one
	}}
	return d.aws, nil
}

// connection is the sinks' configuration for the server.
func (a *awsServer) connection() sqs.Connection {
	return sqs.Connection{Region: motoRegion, Endpoint: a.endpoint, AccessKeyID: motoAccessKeyID,
		SecretAccessKey: sinkconfig.Secret(motoSecretAccessKey)}
}

// startMoto starts moto_server (an SQS/SNS-compatible server, `pip install
// 'moto[server]'`) on a free local port and waits until it answers.
func startMoto(ctx context.Context) (string, func(), error) {
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		return "", nil, errors.New("moto_server is not on PATH: install it (pip install 'moto[server]') or set AWS_ENDPOINT_URL to an SQS/SNS-compatible server (LocalStack, moto)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting moto_server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() { _ = cmd.Process.Kill(); <-exited }
	endpoint := "http://127.0.0.1:" + strconv.Itoa(port)
	// Python takes seconds to start on a loaded machine.
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(endpoint + "/moto-api/")
		if err == nil {
			resp.Body.Close()
			return endpoint, stop, nil
		}
		select {
		case <-exited:
			return "", nil, fmt.Errorf("moto_server exited at start: %v", cmd.ProcessState)
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("moto_server did not answer at %s within a minute: %w", endpoint, err)
		}
	}
}

// fifoQueue creates the FIFO queue name (deleted by the returned func) and
// reads it in the background into got.
func (a *awsServer) fifoQueue(ctx context.Context, name string, got *arrivals) (url string, stop func(), err error) {
	client := awssqs.NewFromConfig(a.cfg)
	out, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name),
		Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		return "", nil, fmt.Errorf("creating queue %s: %w", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	readCtx, stopReading := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for readCtx.Err() == nil {
			res, err := client.ReceiveMessage(readCtx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(url),
				MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
			if err != nil {
				if readCtx.Err() == nil {
					time.Sleep(100 * time.Millisecond) // moto hiccuped; try again
				}
				continue
			}
			now := time.Now()
			var del []sqstypes.DeleteMessageBatchRequestEntry
			for i, m := range res.Messages {
				if v, ok := m.MessageAttributes["herald.id"]; ok {
					got.add(aws.ToString(v.StringValue), now)
				}
				del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
			}
			if len(del) > 0 {
				// A FIFO queue hands out a group's next message only once
				// the earlier ones are deleted.
				_, _ = client.DeleteMessageBatch(readCtx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del})
			}
		}
	}()
	stop = func() {
		stopReading()
		<-done
		delCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = client.DeleteQueue(delCtx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	}
	return url, stop, nil
}

// startSQS sends to a FIFO queue herald-demo-<run>-sqs.fifo (message group
// = the order id, so an order's events stay in order) and reads it back.
func (d *run) startSQS(ctx context.Context, run string) (*brokerPeer, error) {
	srv, err := d.awsEndpoint(ctx)
	if err != nil {
		return nil, err
	}
	got := newArrivals()
	url, stop, err := srv.fifoQueue(ctx, "herald-demo-"+run+"-sqs.fifo", got)
	if err != nil {
		return nil, fmt.Errorf("at %s: %w", srv.endpoint, err)
	}
	sink, err := sqs.New(SinkSQS, sqs.Config{Connection: srv.connection()}, d.opts.Logger)
	if err != nil {
		stop()
		return nil, err
	}
	return &brokerPeer{name: SinkSQS, sink: sink, got: got,
		destination: template.Must(template.New(SinkSQS).Parse(url)), close: stop}, nil
}

// startSNS publishes to a FIFO topic herald-demo-<run>-sns.fifo, to which a
// FIFO queue of the same name is subscribed with raw delivery, and reads
// the queue back.
func (d *run) startSNS(ctx context.Context, run string) (*brokerPeer, error) {
	srv, err := d.awsEndpoint(ctx)
	if err != nil {
		return nil, err
	}
	name := "herald-demo-" + run + "-sns.fifo"
	client := awssns.NewFromConfig(srv.cfg)
	out, err := client.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(name),
		Attributes: map[string]string{"FifoTopic": "true"}})
	if err != nil {
		return nil, fmt.Errorf("creating topic %s at %s: %w", name, srv.endpoint, err)
	}
	arn := aws.ToString(out.TopicArn)
	deleteTopic := func() {
		delCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = client.DeleteTopic(delCtx, &awssns.DeleteTopicInput{TopicArn: aws.String(arn)})
	}
	got := newArrivals()
	url, stopQueue, err := srv.fifoQueue(ctx, name, got)
	if err != nil {
		deleteTopic()
		return nil, fmt.Errorf("at %s: %w", srv.endpoint, err)
	}
	stop := func() { deleteTopic(); stopQueue() }
	attrs, err := awssqs.NewFromConfig(srv.cfg).GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err == nil {
		_, err = client.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: aws.String(arn), Protocol: aws.String("sqs"),
			Endpoint:   aws.String(attrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
			Attributes: map[string]string{"RawMessageDelivery": "true"}})
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("subscribing queue %s to topic %s: %w", name, name, err)
	}
	sink, err := sns.New(SinkSNS, sns.Config{Connection: srv.connection()}, d.opts.Logger)
	if err != nil {
		stop()
		return nil, err
	}
	return &brokerPeer{name: SinkSNS, sink: sink, got: got,
		destination: template.Must(template.New(SinkSNS).Parse(arn)), close: stop}, nil
}
