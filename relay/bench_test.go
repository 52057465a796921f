package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
)

// BenchmarkDrain measures claim + publish (discard) + record: b.N events
// over 1,000 keys, committed up front, drained by one relay.
func BenchmarkDrain(b *testing.B) {
	for _, keys := range []int{1000, 10} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			tb := setup(b)
			evs := make([]ev, 0, 10000)
			for i := 0; i < b.N; i++ {
				evs = append(evs, ev{topic: "bench", key: fmt.Sprintf("k%d", i%keys),
					payload: `{"order_id":"00000000","amount":12345,"currency":"EUR","customer":"c-0000000","items":[{"sku":"sku-1","qty":1}],"note":"padding to about two hundred bytes of json payload......."}`})
				if len(evs) == cap(evs) || i == b.N-1 {
					tb.insert(b, evs...)
					evs = evs[:0]
				}
			}
			cfg := tb.config(b, sinks.NewDiscard("discard"))
			cfg.BatchSize = 1000
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			stop := tb.start(b, cfg)
			for tb.count(b, "true") > 0 {
				time.Sleep(5 * time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			stop()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}
