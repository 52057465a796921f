package relaybench

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// instantSQS is an SQS endpoint in the bench's process that accepts every
// SendMessageBatch entry at once and stores nothing: with it the run
// measures the relay's side alone (claiming, encoding, signing, HTTP,
// acknowledging), which an emulator such as moto hides behind its own
// cost. It speaks the AWS JSON protocol of the operations the run calls:
// CreateQueue, GetQueueUrl, ListQueues and GetQueueAttributes (the sink's
// checks), SendMessageBatch and DeleteQueue.
type instantSQS struct {
	srv *http.Server
	url string
}

// startInstantSQS listens on a free loopback port.
func startInstantSQS() (*instantSQS, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("--aws-instant: listening: %w", err)
	}
	s := &instantSQS{url: "http://" + ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *instantSQS) serve(w http.ResponseWriter, r *http.Request) {
	var in struct {
		QueueName string
		Entries   []struct{ Id, MessageBody string }
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var out any
	switch r.Header.Get("X-Amz-Target") {
	case "AmazonSQS.CreateQueue", "AmazonSQS.GetQueueUrl":
		out = map[string]string{"QueueUrl": s.url + "/000000000000/" + in.QueueName}
	case "AmazonSQS.GetQueueAttributes":
		out = map[string]map[string]string{"Attributes": {"QueueArn": "arn:aws:sqs:us-east-1:000000000000:instant"}}
	case "AmazonSQS.ListQueues":
		out = map[string][]string{"QueueUrls": {}}
	case "AmazonSQS.DeleteQueue":
		out = struct{}{}
	case "AmazonSQS.SendMessageBatch":
		// The SDK checks each entry's body checksum: answer it.
		type ok struct{ Id, MessageId, MD5OfMessageBody string }
		res := struct{ Successful []ok }{Successful: make([]ok, 0, len(in.Entries))}
		for _, e := range in.Entries {
			sum := md5.Sum([]byte(e.MessageBody))
			res.Successful = append(res.Successful, ok{Id: e.Id, MessageId: e.Id, MD5OfMessageBody: hex.EncodeToString(sum[:])})
		}
		out = res
	default:
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#InvalidAction", "message": "not offered by --aws-instant"})
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

func (s *instantSQS) close(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("stopping the --aws-instant endpoint: %w", err)
	}
	return nil
}
