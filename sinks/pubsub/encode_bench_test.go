package pubsub

import (
	"strings"
	"testing"

	"github.com/heraldhq/herald/sinks/internal/cloudevents"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// BenchmarkEncode encodes one event in each format: the cost of
// format: cloudevents next to the herald format.
func BenchmarkEncode(b *testing.B) {
	// 200 bytes of JSON, which the structured mode embeds as it is.
	e := sinktest.Event("orders", "order-7", []byte(`{"pad":"`+strings.Repeat("x", 190)+`"}`))
	e.Headers = map[string]string{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	for _, f := range []struct {
		name string
		cfg  Config
	}{
		{"herald", Config{}},
		{"cloudevents-binary", Config{Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Source: "/bench"}}},
		{"cloudevents-structured", Config{Format: FormatCloudEvents, CloudEvents: cloudevents.Config{Mode: cloudevents.ModeStructured, Source: "/bench"}}},
	} {
		b.Run(f.name, func(b *testing.B) {
			cfg := f.cfg.WithDefaults()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := encode(e, cfg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
