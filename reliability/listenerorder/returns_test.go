package listenerorder

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// batchSize is the publishes per batch of TestReturnBeforeAckSelect, and
// the capacity of its listeners, as gocloud sizes them.
const batchSize = 4

// TestReturnBeforeAckSelect is gocloud's rabbitpubsub batch send: confirm
// mode, NotifyReturn and NotifyPublish listeners buffered to the batch
// size, one select loop that reads both until every confirmation of the
// batch is in. The broker sends each unroutable message's basic.return
// before its basic.ack, so by then every return of the batch must have
// been handed over: received, or waiting in the chan. A batch with fewer
// is a violation; its late returns would be taken for the next batch's.
func TestReturnBeforeAckSelect(t *testing.T) {
	batches := size(t, 300, 2000, 10000)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { returnBeforeAckSelect(t, mode, batches) })
	}
}

func returnBeforeAckSelect(t *testing.T, mode compat.Mode, batches int) {
	verifyNoLeaks(t)
	conn := dial(t, brokerURL(t), mode)
	ch := testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, ch)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, batchSize))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, batchSize))
	nowhere := uniqueName(t, "nowhere") // the default exchange has no such queue

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 16))
	ctx, cancel := context.WithTimeout(context.Background(), runBound)
	defer cancel()

	var (
		violations    examples
		spilled       int // returns received in a later batch than their own
		unroutableAll int
		receivedAll   int
	)
	// received counts one return, for the batch b being waited for.
	received := func(r amqp.Return, b int, got *int) {
		receivedAll++
		if rb, _, _ := strings.Cut(r.MessageId, "/"); rb == strconv.Itoa(b) {
			*got++
		} else {
			spilled++
		}
	}
	start := time.Now()
	for b := 0; b < batches; b++ {
		unroutable := 0
		for i := 0; i < batchSize; i++ {
			key := q
			if rng.IntN(2) == 0 {
				key = nowhere
				unroutable++
			}
			msg := amqp.Publishing{MessageId: fmt.Sprintf("%d/%d", b, i), Body: []byte("listenerorder")}
			if err := ch.PublishWithContext(ctx, "", key, true, false, msg); err != nil {
				t.Fatalf("batch %d: publish: %v", b, err)
			}
		}
		unroutableAll += unroutable
		stop := pump(t, conn, mode)
		got := 0
		for acks := 0; acks < batchSize; {
			select {
			case r := <-returns:
				received(r, b, &got)
			case c := <-confirms:
				if !c.Ack {
					t.Fatalf("batch %d: delivery tag %d nacked", b, c.DeliveryTag)
				}
				acks++
			case <-ctx.Done():
				t.Fatalf("batch %d: %d of %d confirmations within %v", b, acks, batchSize, runBound)
			}
		}
		stop()
		// Whatever was handed over before the last ack is in the buffer.
	buffered:
		for {
			select {
			case r := <-returns:
				received(r, b, &got)
			default:
				break buffered
			}
		}
		if got != unroutable {
			violations.add("batch %d: %d of its %d returns handed over before its last ack", b, got, unroutable)
		}
	}
	took := time.Since(start)

	// Late is not lost: every return still arrives.
	stop := pump(t, conn, mode)
	lost := 0
	for receivedAll < unroutableAll {
		select {
		case <-returns:
			receivedAll++
			spilled++
		case <-time.After(bound):
			lost = unroutableAll - receivedAll
			receivedAll = unroutableAll
		}
	}
	stop()
	t.Logf("%v: %d batches of %d (%d unroutable) in %s; violations: %d batches; returns spilled into a later batch: %d; lost: %d (seed %d)",
		mode, batches, batchSize, unroutableAll, took.Round(time.Millisecond), violations.n, spilled, lost, seed)
	if violations.n > 0 || lost > 0 {
		t.Errorf("%v: %d of %d batches had a confirmation before an earlier return was handed over (%d returns spilled into a later batch, %d never arrived); violations: %v",
			mode, violations.n, batches, spilled, lost, &violations)
	}
}

// TestReturnBeforeDeferredConfirm: an unroutable mandatory publish with a
// deferred confirmation; once WaitContext has returned, the return (which
// the broker sent before the ack) must be in the buffered NotifyReturn
// chan: a non-blocking receive finds it.
func TestReturnBeforeDeferredConfirm(t *testing.T) {
	iterations := size(t, 300, 2000, 10000)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { returnBeforeDeferredConfirm(t, mode, iterations) })
	}
}

func returnBeforeDeferredConfirm(t *testing.T, mode compat.Mode, iterations int) {
	verifyNoLeaks(t)
	conn := dial(t, brokerURL(t), mode)
	ch := testenv.Channel(t, conn)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	nowhere := uniqueName(t, "nowhere")
	ctx, cancel := context.WithTimeout(context.Background(), runBound)
	defer cancel()

	var (
		violations examples
		late, lost int
	)
	start := time.Now()
	for i := 0; i < iterations; i++ {
		id := strconv.Itoa(i)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", nowhere, true, false, amqp.Publishing{MessageId: id})
		if err != nil {
			t.Fatalf("iteration %d: publish: %v", i, err)
		}
		// In legacy mode WaitContext reads frames itself: no pump.
		acked, err := dc.WaitContext(ctx)
		if err != nil {
			t.Fatalf("iteration %d: WaitContext: %v", i, err)
		}
		if !acked {
			t.Fatalf("iteration %d: nacked", i)
		}
		select {
		case r := <-returns:
			if r.MessageId != id {
				t.Fatalf("iteration %d: the return held is message %q", i, r.MessageId)
			}
			continue
		default:
		}
		violations.add("iteration %d: no return in the chan after Wait", i)
		// Take the late return, so the next iteration starts clean.
		stop := pump(t, conn, mode)
		select {
		case r := <-returns:
			late++
			if r.MessageId != id {
				t.Fatalf("iteration %d: the late return is message %q", i, r.MessageId)
			}
		case <-time.After(bound):
			lost++
		}
		stop()
	}
	took := time.Since(start)
	t.Logf("%v: %d deferred confirmations in %s; violations (return not yet handed over when Wait returned): %d; arrived late: %d; lost: %d",
		mode, iterations, took.Round(time.Millisecond), violations.n, late, lost)
	if violations.n > 0 {
		t.Errorf("%v: %d of %d deferred confirmations settled before the return that preceded the ack was handed over (%d arrived later, %d never); violations: %v",
			mode, violations.n, iterations, late, lost, &violations)
	}
}
