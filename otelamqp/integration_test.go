package otelamqp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/amqp091-drainer/amqp091-drainer/otelamqp"
)

const (
	messages = 50
	timeout  = 30 * time.Second
)

// hooks wraps an Observer's funcs so that the test can wait for them.
type hooks struct {
	published, confirmed, delivered, settled, handled <-chan struct{}
}

func watch(obs *amqp.Observer) *hooks {
	h := &hooks{}
	pub := make(chan struct{}, 4*messages)
	origPublished := obs.Published
	obs.Published = func(ctx context.Context, info amqp.PublishInfo, err error) {
		origPublished(ctx, info, err)
		pub <- struct{}{}
	}
	h.published = pub
	handled := make(chan struct{}, 4*messages)
	origHandled := obs.Handled
	obs.Handled = func(d *amqp.Delivery, took time.Duration, err error) {
		origHandled(d, took, err)
		handled <- struct{}{}
	}
	h.handled = handled
	h.confirmed = signal(&obs.Confirmed, 4*messages)
	h.delivered = signal(&obs.Delivered, 4*messages)
	h.settled = signal(&obs.Settled, 4*messages)
	return h
}

// declareQueue declares a server-named exclusive queue on ch, bound to
// amq.direct by its own name, so that the test can publish to it through
// a named exchange and through the default one.
func declareQueue(t *testing.T, ch *amqp.Channel) string {
	t.Helper()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("queue.declare: %v", err)
	}
	if err := ch.QueueBind(q.Name, q.Name, "amq.direct", false, nil); err != nil {
		t.Fatalf("queue.bind: %v", err)
	}
	return q.Name
}

// exchangeOf is where message i goes: even ones through amq.direct, odd
// ones through the default exchange, whose spans are named differently.
func exchangeOf(i int) string {
	if i%2 == 0 {
		return "amq.direct"
	}
	return ""
}

// publishAll publishes the test's messages to q on a confirm-mode
// channel of conn, checking that the caller's headers stay untouched.
func publishAll(t *testing.T, conn *amqp.Connection, q string, h *hooks) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatalf("confirm.select: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for i := 0; i < messages; i++ {
		headers := amqp.Table{"app": "otelamqp-test", "seq": int32(i)}
		msg := amqp.Publishing{
			Headers:       headers,
			MessageId:     fmt.Sprintf("msg-%d", i),
			CorrelationId: fmt.Sprintf("conv-%d", i),
			Body:          []byte(fmt.Sprintf("body %d", i)),
		}
		if err := ch.PublishWithContext(ctx, exchangeOf(i), q, false, false, msg); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		// The observer injects trace context into a copy: the caller's
		// Table must be as the caller left it.
		if len(headers) != 2 || headers["app"] != "otelamqp-test" || headers["seq"] != int32(i) {
			t.Fatalf("publish %d modified the caller's headers: %v", i, headers)
		}
		if _, ok := headers["traceparent"]; ok {
			t.Fatalf("publish %d injected traceparent into the caller's headers", i)
		}
	}
	waitN(t, h.published, messages, timeout, "Published hooks")
	waitN(t, h.confirmed, messages, timeout, "Confirmed hooks")
}

// checkDelivery checks what arrived: the caller's headers plus the
// injected traceparent.
func checkDelivery(t *testing.T, d *amqp.Delivery) {
	t.Helper()
	if d.Headers["app"] != "otelamqp-test" {
		t.Errorf("%s: header app = %v", d.MessageId, d.Headers["app"])
	}
	if tp, _ := d.Headers["traceparent"].(string); !strings.HasPrefix(tp, "00-") {
		t.Errorf("%s: traceparent header = %v", d.MessageId, d.Headers["traceparent"])
	}
}

func TestDrainerPublishConsume(t *testing.T) {
	url := brokerURL(t)
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	h := watch(obs)
	rp := amqp.Drainer(amqp.DrainerOptions{Observer: obs})
	pubConn := dial(t, url, rp)
	subConn := dial(t, url, rp)

	subCh, err := subConn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	q := declareQueue(t, subCh)
	const tag = "otelamqp-test"
	deliveries, err := subCh.Consume(q, tag, false, true, false, false, nil)
	if err != nil {
		t.Fatalf("consume: %v", err)
	}
	starter := otelamqp.NewProcessSpanStarter(tel.options()...)
	got := make(chan struct{}, messages)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range deliveries {
			checkDelivery(t, &d)
			_, span := starter.Start(context.Background(), &d)
			if err := d.Ack(false); err != nil {
				span.RecordError(err)
				t.Errorf("ack %s: %v", d.MessageId, err)
			}
			span.End()
			got <- struct{}{}
		}
	}()

	publishAll(t, pubConn, q, h)
	waitN(t, got, messages, timeout, "deliveries")
	waitN(t, h.settled, messages, timeout, "Settled hooks")
	if err := subCh.Cancel(tag, false); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	select {
	case <-done:
	case <-time.After(timeout):
		t.Fatal("the consumer's deliveries did not close after basic.cancel")
	}

	checkSpans(t, tel.spans.Ended(), q, false)
	checkMetrics(t, tel, q)
}

func TestLegacyPublishConsumeFunc(t *testing.T) {
	url := brokerURL(t)
	tel := newTelemetry(t)
	obs := otelamqp.NewObserver(tel.options()...)
	h := watch(obs)
	rp := amqp.Legacy(amqp.LegacyOptions{AutoDrain: true, Observer: obs})
	pubConn := dial(t, url, rp)
	subConn := dial(t, url, rp)

	subCh, err := subConn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	q := declareQueue(t, subCh)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errLast := errors.New("handler failed on the last message")
	handledN := 0
	consumed := make(chan error, 1)
	go func() {
		consumed <- subCh.ConsumeFunc(ctx, q, amqp.ConsumeFuncOptions{Exclusive: true}, func(d *amqp.Delivery) error {
			checkDelivery(t, d)
			if err := d.Ack(false); err != nil {
				return err
			}
			handledN++
			// The last handler fails: its process span must say so, and
			// the error ends the consumption.
			if handledN == messages {
				return errLast
			}
			return nil
		})
	}()

	publishAll(t, pubConn, q, h)
	waitN(t, h.handled, messages, timeout, "Handled hooks")
	select {
	case err := <-consumed:
		if !errors.Is(err, errLast) {
			t.Fatalf("ConsumeFunc returned %v, want the handler's error", err)
		}
	case <-time.After(timeout):
		t.Fatal("ConsumeFunc did not return after the handler's error")
	}
	waitN(t, h.settled, messages, timeout, "Settled hooks")

	ended := tel.spans.Ended()
	checkSpans(t, ended, q, true)
	checkMetrics(t, tel, q)
	rm := tel.collect(t)
	if n := sum(t, rm, "messaging.process.duration"); n != messages {
		t.Errorf("messaging.process.duration count = %d, want %d", n, messages)
	}
	if n := sum(t, rm, "messaging.process.duration", attribute.String("error.type", "*errors.errorString")); n != 1 {
		t.Errorf("messaging.process.duration with error.type = %d, want 1", n)
	}
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	m := map[string]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// wantAttrs checks that s has the attributes of want, by the names the
// semantic conventions give them (spelled out here rather than taken from
// the semconv package, so that a rename there shows up).
func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	got := spanAttrs(s)
	for k, w := range want {
		v, ok := got[k]
		if !ok {
			t.Errorf("span %q: no attribute %s (has %v)", s.Name(), k, s.Attributes())
			continue
		}
		if w == nil {
			continue // present is enough
		}
		if v.String() != fmt.Sprint(w) {
			t.Errorf("span %q: %s = %s, want %v", s.Name(), k, v.String(), w)
		}
	}
}

func sameSpan(a, b trace.SpanContext) bool {
	return a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID()
}

func checkSpans(t *testing.T, ended []sdktrace.ReadOnlySpan, q string, handlerFails bool) {
	t.Helper()
	producers := map[string]sdktrace.ReadOnlySpan{}
	var receives, processes []sdktrace.ReadOnlySpan
	for _, s := range ended {
		switch s.SpanKind() {
		case trace.SpanKindProducer:
			producers[spanAttrs(s)["messaging.message.id"].AsString()] = s
		case trace.SpanKindClient:
			receives = append(receives, s)
		case trace.SpanKindConsumer:
			processes = append(processes, s)
		}
	}
	if len(producers) != messages || len(receives) != messages || len(processes) != messages {
		t.Fatalf("spans: %d producer, %d receive, %d process; want %d each", len(producers), len(receives), len(processes), messages)
	}
	for i := 0; i < messages; i++ {
		id := fmt.Sprintf("msg-%d", i)
		p := producers[id]
		if p == nil {
			t.Fatalf("no producer span for %s", id)
		}
		ex := exchangeOf(i)
		name, dest := "publish amq.direct", "amq.direct:"+q
		if ex == "" {
			// The default exchange and a server-named queue: the span
			// name leaves out the queue's one-off name.
			name, dest = "publish", q
		}
		if p.Name() != name {
			t.Errorf("%s: producer span name %q, want %q", id, p.Name(), name)
		}
		wantAttrs(t, p, map[string]any{
			"messaging.system":                           "rabbitmq",
			"messaging.operation.type":                   "send",
			"messaging.operation.name":                   "publish",
			"messaging.destination.name":                 dest,
			"messaging.rabbitmq.destination.routing_key": q,
			"messaging.message.body.size":                len(fmt.Sprintf("body %d", i)),
			"messaging.message.id":                       id,
			"messaging.message.conversation_id":          fmt.Sprintf("conv-%d", i),
			"messaging.rabbitmq.message.delivery_tag":    i + 1,
		})
		if p.Status().Code == codes.Error {
			t.Errorf("%s: producer span has error status %v", id, p.Status())
		}
	}
	for _, r := range receives {
		id := spanAttrs(r)["messaging.message.id"].AsString()
		p := producers[id]
		if p == nil {
			t.Fatalf("receive span %q: no producer for message %q", r.Name(), id)
		}
		links := r.Links()
		if len(links) != 1 || !sameSpan(links[0].SpanContext, p.SpanContext()) {
			t.Errorf("%s: receive span links %v, want one to the producer %v", id, links, p.SpanContext())
		}
		if r.Parent().IsValid() {
			t.Errorf("%s: receive span has a parent %v; it should be a root linked to its producer", id, r.Parent())
		}
		wantAttrs(t, r, map[string]any{
			"messaging.system":                           "rabbitmq",
			"messaging.operation.type":                   "receive",
			"messaging.operation.name":                   "receive",
			"messaging.destination.name":                 nil,
			"messaging.rabbitmq.destination.routing_key": q,
			"messaging.message.body.size":                nil,
			"messaging.rabbitmq.message.delivery_tag":    nil,
			"messaging.message.conversation_id":          nil,
		})
	}
	failed := 0
	for _, s := range processes {
		id := spanAttrs(s)["messaging.message.id"].AsString()
		p := producers[id]
		if p == nil {
			t.Fatalf("process span %q: no producer for message %q", s.Name(), id)
		}
		if !sameSpan(s.Parent(), p.SpanContext()) {
			t.Errorf("%s: process span parent %v, want the producer %v", id, s.Parent(), p.SpanContext())
		}
		if links := s.Links(); len(links) != 1 || !sameSpan(links[0].SpanContext, p.SpanContext()) {
			t.Errorf("%s: process span links %v, want one to the producer", id, links)
		}
		if !strings.HasPrefix(s.Name(), "process") {
			t.Errorf("%s: process span name %q", id, s.Name())
		}
		wantAttrs(t, s, map[string]any{
			"messaging.system":         "rabbitmq",
			"messaging.operation.type": "process",
			"messaging.operation.name": "process",
		})
		if s.Status().Code == codes.Error {
			failed++
			if _, ok := spanAttrs(s)["error.type"]; !ok {
				t.Errorf("%s: failed process span without error.type", id)
			}
		}
		if !s.EndTime().After(s.StartTime()) && !s.EndTime().Equal(s.StartTime()) {
			t.Errorf("%s: process span ends before it starts", id)
		}
	}
	want := 0
	if handlerFails {
		want = 1
	}
	if failed != want {
		t.Errorf("%d process spans with error status, want %d", failed, want)
	}
}

func checkMetrics(t *testing.T, tel *telemetry, q string) {
	t.Helper()
	rm := tel.collect(t)
	system := attribute.String("messaging.system", "rabbitmq")
	for _, c := range []struct {
		name  string
		match []attribute.KeyValue
		want  int64
	}{
		{"messaging.client.sent.messages", []attribute.KeyValue{system, attribute.String("messaging.operation.name", "publish")}, messages},
		{"messaging.client.sent.messages", []attribute.KeyValue{attribute.String("messaging.destination.name", "amq.direct:"+q)}, messages / 2},
		{"messaging.client.sent.messages", []attribute.KeyValue{attribute.Bool("messaging.destination.anonymous", true)}, messages / 2},
		{"messaging.client.operation.duration", []attribute.KeyValue{attribute.String("messaging.operation.type", "send")}, messages},
		{"messaging.client.consumed.messages", []attribute.KeyValue{system, attribute.String("messaging.operation.name", "receive")}, messages},
		{otelamqp.MetricPublishConfirmed, []attribute.KeyValue{system}, messages},
		{otelamqp.MetricPublishNacked, nil, 0},
		{otelamqp.MetricPublishReturned, nil, 0},
		{otelamqp.MetricConfirmLatency, nil, messages},
		{otelamqp.MetricDeliveryAcked, []attribute.KeyValue{system}, messages},
		{otelamqp.MetricDeliveryNacked, nil, 0},
		{otelamqp.MetricConnectionEvents, []attribute.KeyValue{attribute.String("amqp091.connection.event", "opened")}, 2},
	} {
		if got := sum(t, rm, c.name, c.match...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.match, got, c.want)
		}
	}
	// Every synchronous method of the test (channel.open, confirm.select,
	// queue.declare, ...) records its latency by method.
	if n := sum(t, rm, otelamqp.MetricRPCDuration, attribute.String("amqp091.rpc.method", "queue.declare")); n != 1 {
		t.Errorf("%s{queue.declare} count = %d, want 1", otelamqp.MetricRPCDuration, n)
	}
}
