package otelamqp_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp"
)

// These tests call the Observer's funcs directly, as the read path would,
// to reach what a healthy broker rarely produces: failed publishes, nacks,
// returns, budget pauses, failed connections.

func TestPublishedError(t *testing.T) {
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	info := amqp.PublishInfo{Channel: 1, Exchange: "orders", RoutingKey: "eu.new", BodySize: 3}
	msg := &amqp.Publishing{Body: []byte("abc")}
	ctx := obs.BeforePublish(context.Background(), info, msg)
	if !trace.SpanFromContext(ctx).SpanContext().IsValid() {
		t.Fatal("BeforePublish returned a context without its span")
	}
	if _, ok := msg.Headers["traceparent"]; !ok {
		t.Fatalf("no traceparent injected into nil headers: %v", msg.Headers)
	}
	obs.Published(ctx, info, amqp.ErrClosed)

	spans := tel.spans.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Name() != "publish orders" || s.SpanKind() != trace.SpanKindProducer {
		t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
	}
	if s.Status().Code != codes.Error {
		t.Errorf("status %v, want error", s.Status())
	}
	// error.type is ErrClosed's reply code.
	wantAttrs(t, s, map[string]any{
		"messaging.destination.name":                 "orders:eu.new",
		"messaging.rabbitmq.destination.routing_key": "eu.new",
		"error.type": "504",
	})
	if _, ok := spanAttrs(s)["messaging.rabbitmq.message.delivery_tag"]; ok {
		t.Error("delivery tag set outside confirm mode")
	}
	rm := tel.collect(t)
	if n := sum(t, rm, "messaging.client.sent.messages", attribute.String("error.type", "504")); n != 1 {
		t.Errorf("failed sends counted %d, want 1", n)
	}
}

func TestNoPropagatorNoCopy(t *testing.T) {
	tel := newTelemetry(t)
	// An empty composite propagator writes nothing: the Publishing's
	// headers must then stay the caller's Table, not a copy.
	obs := otelamqp.NewObserver(append(tel.options(), otelamqp.WithPropagators(propagation.NewCompositeTextMapPropagator()))...)
	headers := amqp.Table{"k": "v"}
	msg := &amqp.Publishing{Headers: headers}
	ctx := obs.BeforePublish(context.Background(), amqp.PublishInfo{RoutingKey: "q"}, msg)
	obs.Published(ctx, amqp.PublishInfo{RoutingKey: "q"}, nil)
	msg.Headers["probe"] = 1
	if headers["probe"] != 1 {
		t.Error("headers were copied although nothing was injected")
	}
}

func TestInjectCopiesHeaders(t *testing.T) {
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	headers := amqp.Table{"k": "v", "nested": amqp.Table{"a": int32(1)}}
	msg := &amqp.Publishing{Headers: headers}
	ctx := obs.BeforePublish(context.Background(), amqp.PublishInfo{RoutingKey: "q"}, msg)
	obs.Published(ctx, amqp.PublishInfo{RoutingKey: "q"}, nil)
	if len(headers) != 2 {
		t.Errorf("caller's headers changed: %v", headers)
	}
	if msg.Headers["k"] != "v" || msg.Headers["traceparent"] == nil || len(msg.Headers) != 3 {
		t.Errorf("published headers %v, want the caller's plus traceparent", msg.Headers)
	}
}

func TestContextFromDelivery(t *testing.T) {
	tel := newTelemetry(t)
	opts := tel.options()
	obs := otelamqp.NewObserver(opts...)
	msg := &amqp.Publishing{}
	ctx := obs.BeforePublish(context.Background(), amqp.PublishInfo{Exchange: "x"}, msg)
	producer := trace.SpanFromContext(ctx).SpanContext()
	obs.Published(ctx, amqp.PublishInfo{Exchange: "x"}, nil)

	d := &amqp.Delivery{Headers: msg.Headers, Exchange: "x"}
	got := trace.SpanContextFromContext(otelamqp.ContextFromDelivery(context.Background(), d, opts...))
	if !got.IsRemote() || !sameSpan(got, producer) {
		t.Errorf("ContextFromDelivery = %v, want the producer %v, remote", got, producer)
	}
	// Headers written by another client as byte arrays work too.
	d.Headers = amqp.Table{"traceparent": []byte(d.Headers["traceparent"].(string))}
	got = trace.SpanContextFromContext(otelamqp.ContextFromDelivery(context.Background(), d, opts...))
	if !sameSpan(got, producer) {
		t.Errorf("ContextFromDelivery with []byte header = %v", got)
	}
	// No headers: ctx unchanged.
	type key struct{}
	base := context.WithValue(context.Background(), key{}, 1)
	if otelamqp.ContextFromDelivery(base, &amqp.Delivery{}, opts...) != base {
		t.Error("ContextFromDelivery without headers changed ctx")
	}

	_, span := otelamqp.StartProcessSpan(context.Background(), d, opts...)
	span.End()
	ended := tel.spans.Ended()
	p := ended[len(ended)-1]
	if p.SpanKind() != trace.SpanKindConsumer || p.Name() != "process x" || !sameSpan(p.Parent(), producer) {
		t.Errorf("process span %q kind %v parent %v", p.Name(), p.SpanKind(), p.Parent())
	}
}

func TestHandledSpansOff(t *testing.T) {
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options(otelamqp.WithHandledSpans(false))...)
	obs.Handled(&amqp.Delivery{RoutingKey: "q"}, time.Millisecond, errors.New("boom"))
	if n := len(tel.spans.Ended()); n != 0 {
		t.Errorf("%d spans with WithHandledSpans(false)", n)
	}
	rm := tel.collect(t)
	if n := sum(t, rm, "messaging.process.duration"); n != 1 {
		t.Errorf("process duration count %d, want 1", n)
	}
}

func TestHandledSpanTiming(t *testing.T) {
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	took := 250 * time.Millisecond
	obs.Handled(&amqp.Delivery{RoutingKey: "q"}, took, nil)
	s := tel.spans.Ended()[0]
	if d := s.EndTime().Sub(s.StartTime()); d != took {
		t.Errorf("process span lasted %v, want the handler's %v", d, took)
	}
}

func TestMetricsHooks(t *testing.T) {
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options(otelamqp.WithServerAddress("broker.example", 5672))...)
	obs.Confirmed(amqp.ConfirmInfo{DeliveryTag: 1, Ack: true, Latency: time.Millisecond})
	obs.Confirmed(amqp.ConfirmInfo{DeliveryTag: 2, Ack: false})
	obs.Returned(&amqp.Return{ReplyCode: 312, Exchange: "x", RoutingKey: "nowhere"})
	obs.Settled(amqp.SettleInfo{Kind: amqp.SettleAck, DeliveryTag: 1})
	obs.Settled(amqp.SettleInfo{Kind: amqp.SettleNack, DeliveryTag: 2, Requeue: true})
	obs.Settled(amqp.SettleInfo{Kind: amqp.SettleReject, DeliveryTag: 3})
	obs.SettleRefused(amqp.SettleInfo{Kind: amqp.SettleAck, DeliveryTag: 2}, fmt.Errorf("ack: %w", amqp.ErrStaleDelivery))
	obs.SettleRefused(amqp.SettleInfo{Kind: amqp.SettleNack, DeliveryTag: 99}, fmt.Errorf("nack: %w", amqp.ErrUnknownDeliveryTag))
	obs.RPC(amqp.RPCInfo{Method: "queue.declare", Latency: time.Millisecond})
	obs.RPC(amqp.RPCInfo{Method: "queue.declare", Err: &amqp.Error{Code: 406, Reason: "PRECONDITION_FAILED"}})
	obs.BudgetPaused(amqp.BudgetInfo{Limit: 100, Used: 100})
	obs.BudgetResumed(amqp.BudgetInfo{Limit: 100, Used: 50, Paused: time.Second})
	obs.ListenerDropped(amqp.ListenerStats{Kind: amqp.KindNotifyPublish, Channel: 1})
	obs.Connection(amqp.ConnectionEvent{Kind: amqp.ConnectionOpened, Mode: "drainer"})
	obs.Connection(amqp.ConnectionEvent{Kind: amqp.ConnectionFailed, Mode: "drainer", Err: amqp.ErrClosed})

	rm := tel.collect(t)
	server := attribute.String("server.address", "broker.example")
	for _, c := range []struct {
		name  string
		match []attribute.KeyValue
		want  int64
	}{
		{otelamqp.MetricPublishConfirmed, []attribute.KeyValue{server, attribute.Int("server.port", 5672)}, 1},
		{otelamqp.MetricPublishNacked, nil, 1},
		{otelamqp.MetricConfirmLatency, nil, 1}, // the nack had no latency
		{otelamqp.MetricPublishReturned, []attribute.KeyValue{attribute.Int("amqp091.reply_code", 312), attribute.String("messaging.destination.name", "x:nowhere")}, 1},
		{otelamqp.MetricDeliveryAcked, nil, 1},
		{otelamqp.MetricDeliveryNacked, []attribute.KeyValue{attribute.Bool("amqp091.requeue", true)}, 1},
		{otelamqp.MetricDeliveryRejected, []attribute.KeyValue{attribute.Bool("amqp091.requeue", false)}, 1},
		{otelamqp.MetricSettleRefused, []attribute.KeyValue{attribute.String("amqp091.settle.kind", "ack"), attribute.String("error.type", "stale_delivery")}, 1},
		{otelamqp.MetricSettleRefused, []attribute.KeyValue{attribute.String("amqp091.settle.kind", "nack"), attribute.String("error.type", "unknown_delivery_tag")}, 1},
		{otelamqp.MetricRPCDuration, []attribute.KeyValue{attribute.String("amqp091.rpc.method", "queue.declare")}, 2},
		{otelamqp.MetricRPCDuration, []attribute.KeyValue{attribute.String("error.type", "406")}, 1},
		{otelamqp.MetricBudgetPauses, nil, 1},
		{otelamqp.MetricBudgetPauseTime, nil, 1},
		{otelamqp.MetricListenerDropped, []attribute.KeyValue{attribute.String("amqp091.listener.kind", "NotifyPublish")}, 1},
		{otelamqp.MetricConnectionEvents, []attribute.KeyValue{attribute.String("amqp091.connection.event", "opened"), attribute.String("amqp091.read_mode", "drainer")}, 1},
		{otelamqp.MetricConnectionEvents, []attribute.KeyValue{attribute.String("amqp091.connection.event", "failed"), attribute.String("error.type", "504")}, 1},
	} {
		if got := sum(t, rm, c.name, c.match...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.match, got, c.want)
		}
	}
}

// TestCredentialRefreshed feeds Refreshed one outcome of each kind: a
// failure is counted under one of three fixed error.type values derived
// from the error, never its text, which here quotes a secret.
func TestCredentialRefreshed(t *testing.T) {
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	const secret = "eyJhbGciOi-secret"
	expires := time.Now().Add(time.Hour)
	ok := amqp.RefreshInfo{Expires: expires, Took: 3 * time.Millisecond}
	failed := func(err error) amqp.RefreshInfo {
		return amqp.RefreshInfo{Expires: expires, Took: time.Millisecond, Err: err}
	}
	obs.Refreshed(ok)
	obs.Refreshed(ok)
	obs.Refreshed(failed(fmt.Errorf("%w for broker:5672: %w", amqp.ErrCredentialsProvider,
		errors.New("token endpoint: 401 for "+secret))))
	obs.Refreshed(failed(fmt.Errorf("%w for broker:5672: no answer within 30s: %w",
		amqp.ErrCredentialsProvider, context.DeadlineExceeded)))
	obs.Refreshed(failed(fmt.Errorf("%w: the provider's new secret expired at 2026-01-01T00:00:00Z",
		amqp.ErrCredentialsExpired)))
	obs.Refreshed(failed(fmt.Errorf("amqp: update-secret refused by broker:5672: %w",
		&amqp.Error{Code: 530, Reason: "NOT_ALLOWED - " + secret})))
	obs.Refreshed(failed(fmt.Errorf("amqp: update-secret refused by broker:5672: %w", amqp.ErrClosed)))

	rm := tel.collect(t)
	m := findMetric(rm, otelamqp.MetricCredentialRefreshes)
	if m == nil {
		t.Fatalf("%s missing", otelamqp.MetricCredentialRefreshes)
	}
	if m.Unit != "{refresh}" {
		t.Errorf("unit %q, want {refresh}", m.Unit)
	}
	got := map[string]int64{}
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		errType, _ := p.Attributes.Value("error.type")
		got[errType.AsString()] += p.Value
		for _, kv := range p.Attributes.ToSlice() {
			if v := kv.Value.String(); strings.Contains(v, secret) || strings.Contains(v, "broker:5672") {
				t.Errorf("attribute %s = %q carries the error's text", kv.Key, v)
			}
		}
	}
	want := map[string]int64{"": 2, "provider": 2, "expired": 1, "refused": 2}
	if !maps.Equal(got, want) {
		t.Errorf("refreshes by error.type %v, want %v", got, want)
	}
}

func TestHeaderCarrier(t *testing.T) {
	c := otelamqp.HeaderCarrier(amqp.Table{"s": "a", "b": []byte("c"), "n": int32(1)})
	if c.Get("s") != "a" || c.Get("b") != "c" || c.Get("n") != "" || c.Get("missing") != "" {
		t.Errorf("Get: %q %q %q", c.Get("s"), c.Get("b"), c.Get("n"))
	}
	c.Set("x", "y")
	if c["x"] != "y" || len(c.Keys()) != 4 {
		t.Errorf("Set/Keys: %v %v", c, c.Keys())
	}
}

// An application may wrap BeforePublish and derive a context of its own
// from the instrumentation's: Published must still find its state.
func TestWrappedBeforePublish(t *testing.T) {
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	type key struct{}
	inner := obs.BeforePublish
	obs.BeforePublish = func(ctx context.Context, info amqp.PublishInfo, msg *amqp.Publishing) context.Context {
		return context.WithValue(inner(ctx, info, msg), key{}, "app")
	}
	info := amqp.PublishInfo{Exchange: "x", DeliveryTag: 7}
	ctx := obs.BeforePublish(context.Background(), info, &amqp.Publishing{})
	obs.Published(ctx, info, nil)
	if n := len(tel.spans.Ended()); n != 1 {
		t.Fatalf("%d spans ended, want 1", n)
	}
	rm := tel.collect(t)
	if n := sum(t, rm, "messaging.client.operation.duration"); n != 1 {
		t.Errorf("operation duration count %d, want 1", n)
	}
}
