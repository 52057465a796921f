package routefilter_test

import (
	"testing"

	"github.com/heraldhq/herald/internal/routefilter"
)

// BenchmarkFilter measures one filter on one event, as the relay runs it
// per event: a fresh Event each time, so the payload is parsed in every
// iteration where the expression reads it. The payload is a typical order
// of about 300 bytes.
func BenchmarkFilter(b *testing.B) {
	payload := []byte(`{"order_id": "ord_8f14e45f", "customer": {"id": "cus_42", "email": "ada@example.com"},
"total": 149.90, "currency": "EUR", "lines": [{"sku": "BOOK-1", "qty": 1, "price": 99.90}, {"sku": "PEN-7", "qty": 5, "price": 10.00}],
"status": "paid"}`)
	headers := map[string]string{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	for _, c := range []struct{ name, expr string }{
		{"typical", `payload.total > 100 && headers["tenant"] == "acme"`},
		{"headers-only", `headers["tenant"] == "acme" && topic.startsWith("orders.")`},
		{"list-walk", `payload.lines.exists(l, l.sku == "PEN-7" && l.qty > 2)`},
	} {
		f, err := routefilter.Compile(c.expr)
		if err != nil {
			b.Fatal(err)
		}
		ev := routefilter.Event{Topic: "orders.created", Key: "cus_42", Headers: headers, Payload: payload, JSON: true}
		if ok, err := f.Match(&ev); !ok || err != nil {
			b.Fatalf("%s: %v, %v; want a match", c.name, ok, err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ev := routefilter.Event{Topic: "orders.created", Key: "cus_42", Headers: headers, Payload: payload, JSON: true}
				if ok, err := f.Match(&ev); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
