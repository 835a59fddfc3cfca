package otelamqp_test

import (
	"context"
	"testing"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp/internal/overhead"
)

// BenchmarkPublish publishes 64-byte messages with confirms over a
// drainer-mode connection with no Observer (none), one whose funcs do
// nothing (noop) and otelamqp's over a real SDK (otel). cmd/overhead runs
// the same variants alternated over several rounds, which is the fairer
// comparison on a noisy machine.
func BenchmarkPublish(b *testing.B) {
	url := brokerURL(b)
	for _, v := range overhead.Variants() {
		b.Run(v.Name, func(b *testing.B) {
			p, err := overhead.Dial(url, v, 64)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			// A warm-up, so that the connection's buffers and the SDK's
			// caches are in place before the timer starts.
			if err := p.Publish(ctx, 1000); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			if err := p.Publish(ctx, b.N); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}
