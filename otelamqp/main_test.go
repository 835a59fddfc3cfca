package otelamqp_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp"
)

// TestMain fails the run if a test leaves a goroutine behind: a read path
// or a consumer loop that outlives its connection would be a leak the
// instrumentation caused or hid.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const defaultURL = "amqp://guest:guest@127.0.0.1:5672/"

var (
	brokerOnce sync.Once
	brokerAddr string
	brokerErr  string
)

// brokerURL returns the broker to test against: AMQP_URL if it answers,
// else the local default. With neither, the test fails: these tests are
// about what goes over the wire, and a skip would pass them silently.
func brokerURL(t testing.TB) string {
	t.Helper()
	brokerOnce.Do(func() {
		candidates := []string{defaultURL}
		if u := os.Getenv("AMQP_URL"); u != "" {
			candidates = []string{u, defaultURL}
		}
		for _, u := range candidates {
			uri, err := amqp.ParseURI(u)
			if err != nil {
				brokerErr += u + ": " + err.Error() + "; "
				continue
			}
			c, err := net.DialTimeout("tcp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)), 3*time.Second)
			if err != nil {
				brokerErr += u + ": " + err.Error() + "; "
				continue
			}
			c.Close()
			brokerAddr = u
			return
		}
	})
	if brokerAddr == "" {
		t.Fatalf("no RabbitMQ broker reachable (%s). Start one with `rabbitmq-server -detached` "+
			"(or `docker run -d -p 5672:5672 rabbitmq:4`), or set AMQP_URL=amqp://user:pass@host:port/vhost", brokerErr)
	}
	return brokerAddr
}

// telemetry is an in-memory SDK: spans land in a SpanRecorder, metrics are
// read on demand through a ManualReader.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t testing.TB) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(tel.spans))
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		ctx := context.Background()
		_ = tel.tp.Shutdown(ctx)
		_ = tel.mp.Shutdown(ctx)
	})
	return tel
}

func (tel *telemetry) options(extra ...otelamqp.Option) []otelamqp.Option {
	return append([]otelamqp.Option{
		otelamqp.WithTracerProvider(tel.tp),
		otelamqp.WithMeterProvider(tel.mp),
		otelamqp.WithPropagators(propagation.TraceContext{}),
	}, extra...)
}

func (tel *telemetry) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect metrics: %v", err)
	}
	return rm
}

// findMetric returns the metric called name, or nil.
func findMetric(rm metricdata.ResourceMetrics, name string) *metricdata.Metrics {
	for _, sm := range rm.ScopeMetrics {
		for i := range sm.Metrics {
			if sm.Metrics[i].Name == name {
				return &sm.Metrics[i]
			}
		}
	}
	return nil
}

// sum adds up the data points of a counter, of a gauge, or the counts of
// a histogram, over the data points whose attributes include match.
func sum(t testing.TB, rm metricdata.ResourceMetrics, name string, match ...attribute.KeyValue) int64 {
	t.Helper()
	m := findMetric(rm, name)
	if m == nil {
		return 0
	}
	has := func(set attribute.Set) bool {
		for _, kv := range match {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	var n int64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if has(p.Attributes) {
				n += p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if has(p.Attributes) {
				n += p.Value
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if has(p.Attributes) {
				n += int64(p.Count)
			}
		}
	default:
		t.Fatalf("metric %s: unexpected data %T", name, m.Data)
	}
	return n
}

// dial opens a connection with rp and closes it at the end of the test.
func dial(t testing.TB, url string, rp amqp.ReadPath) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(url, amqp.Config{ReadPath: rp})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// signal wraps hook so that it also sends on a chan after running:
// tests wait on the chan instead of sleeping.
func signal[T any](hook *func(T), capacity int) <-chan struct{} {
	ch := make(chan struct{}, capacity)
	orig := *hook
	*hook = func(v T) {
		if orig != nil {
			orig(v)
		}
		ch <- struct{}{}
	}
	return ch
}

// waitN receives n signals from ch, failing the test if they take longer
// than timeout in all.
func waitN(t testing.TB, ch <-chan struct{}, n int, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: got %d of %d within %v", what, i, n, timeout)
		}
	}
}
