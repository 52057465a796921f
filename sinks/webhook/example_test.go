package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/webhook"
)

// A consumer checks each request with Verify before trusting it, and uses
// webhook-id to drop duplicates.
func ExampleNew() {
	const secret sinkconfig.Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secret, r.Header, body, 5*time.Minute); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		fmt.Printf("%s %s\n", r.Header.Get("webhook-id"), body)
	}))
	defer endpoint.Close()

	sink, err := webhook.New("orders-hook", webhook.Config{URL: endpoint.URL, Secret: secret}, slog.New(slog.DiscardHandler))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sink.Close(context.Background())
	errs := sink.Publish(context.Background(), []sinks.Event{{
		ID: "0190a5c4-0000-7000-8000-000000000001", Topic: "orders", Key: "order-42",
		Payload: []byte(`{"total":12}`), ContentType: sinks.ContentTypeJSON,
		CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
	}})
	fmt.Println(errs[0])
	// Output:
	// 0190a5c4-0000-7000-8000-000000000001 {"id":"0190a5c4-0000-7000-8000-000000000001","topic":"orders","key":"order-42","content_type":"application/json","created_at":"2025-01-02T03:04:05Z","payload":{"total":12}}
	// <nil>
}

func ExampleVerify() {
	header := http.Header{}
	header.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	header.Set("webhook-timestamp", "1614265330")
	header.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	body := []byte(`{"test": 2432232314}`)

	// A tolerance of 0 skips the timestamp check, since this example is old;
	// real consumers pass a few minutes to refuse replays.
	fmt.Println(webhook.Verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", header, body, 0))
	err := webhook.Verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", header, []byte(`{"test": 1}`), 0)
	fmt.Println(errors.Is(err, webhook.ErrBadSignature))
	err = webhook.Verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", header, body, 5*time.Minute)
	fmt.Println(errors.Is(err, webhook.ErrStaleTimestamp))
	// Output:
	// <nil>
	// true
	// true
}
