package listenerorder

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// TestCancelBeforeDeliveriesClose: the broker cancels a consumer because
// its queue is deleted (from another channel). Upstream hands the tag to
// NotifyCancel before it closes the deliveries chan, so once ranging the
// deliveries chan ends, a non-blocking receive on the buffered NotifyCancel
// chan must hold the tag.
func TestCancelBeforeDeliveriesClose(t *testing.T) {
	iterations := size(t, 50, 300, 2000)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { cancelBeforeDeliveriesClose(t, mode, iterations) })
	}
}

func cancelBeforeDeliveriesClose(t *testing.T, mode compat.Mode, iterations int) {
	verifyNoLeaks(t)
	conn := dial(t, brokerURL(t), mode)
	ch := testenv.Channel(t, conn)
	admin := testenv.Channel(t, conn)
	cancels := ch.NotifyCancel(make(chan string, 1))

	var (
		violations examples
		late, lost int
	)
	start := time.Now()
	for i := 0; i < iterations; i++ {
		q := testenv.ExclusiveQueue(t, admin)
		tag := fmt.Sprintf("listenerorder-%d", i)
		deliveries, err := ch.Consume(q, tag, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("iteration %d: consume: %v", i, err)
		}
		if _, err := admin.QueueDelete(q, false, false, false); err != nil {
			t.Fatalf("iteration %d: delete the queue: %v", i, err)
		}
		stop := pump(t, conn, mode)
		guard := time.NewTimer(bound)
	ranging:
		for {
			select {
			case _, ok := <-deliveries:
				if !ok {
					break ranging
				}
				t.Fatalf("iteration %d: a delivery from an empty queue", i)
			case <-guard.C:
				t.Fatalf("iteration %d: the deliveries chan did not close within %v of the queue's deletion", i, bound)
			}
		}
		guard.Stop()
		select {
		case got := <-cancels:
			if got != tag {
				t.Fatalf("iteration %d: NotifyCancel held %q, want %q", i, got, tag)
			}
		default:
			violations.add("iteration %d: deliveries closed, NotifyCancel empty", i)
			select {
			case got := <-cancels:
				late++
				if got != tag {
					t.Fatalf("iteration %d: NotifyCancel got %q late, want %q", i, got, tag)
				}
			case <-time.After(bound):
				lost++
			}
		}
		stop()
	}
	took := time.Since(start)
	t.Logf("%v: %d consumers cancelled by the broker in %s; violations (deliveries closed before the tag was handed to NotifyCancel): %d; arrived late: %d; lost: %d",
		mode, iterations, took.Round(time.Millisecond), violations.n, late, lost)
	if violations.n > 0 || lost > 0 {
		t.Errorf("%v: %d of %d cancelled consumers had their deliveries chan closed before the tag reached NotifyCancel (%d arrived later, %d never); violations: %v",
			mode, violations.n, iterations, late, lost, &violations)
	}
}

// TestCloseAfterReturns: n unroutable mandatory publishes, then a publish
// to an exchange that does not exist, which the broker answers with
// channel.close 404 after the n returns. One select loop reads an
// unbuffered NotifyReturn and a NotifyClose buffered to 1 (as the close
// listener must be) until both are closed; it must receive the n returns,
// in order, before the close error.
func TestCloseAfterReturns(t *testing.T) {
	rounds := size(t, 30, 200, 1000)
	const n = 20
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { closeAfterReturns(t, mode, rounds, n) })
	}
}

func closeAfterReturns(t *testing.T, mode compat.Mode, rounds, n int) {
	verifyNoLeaks(t)
	conn := dial(t, brokerURL(t), mode)
	nowhere := uniqueName(t, "nowhere")
	noExchange := uniqueName(t, "no-exchange")
	ctx, cancel := context.WithTimeout(context.Background(), runBound)
	defer cancel()

	var violations examples
	start := time.Now()
	for r := 0; r < rounds; r++ {
		ch := testenv.Channel(t, conn)
		returns := ch.NotifyReturn(make(chan amqp.Return))
		closes := ch.NotifyClose(make(chan *amqp.Error, 1))
		for i := 0; i < n; i++ {
			if err := ch.PublishWithContext(ctx, "", nowhere, true, false, amqp.Publishing{MessageId: strconv.Itoa(i)}); err != nil {
				t.Fatalf("round %d: publish %d: %v", r, i, err)
			}
		}
		if err := ch.PublishWithContext(ctx, noExchange, "x", false, false, amqp.Publishing{}); err != nil {
			t.Fatalf("round %d: publish to the missing exchange: %v", r, err)
		}
		stop := pump(t, conn, mode)
		var (
			got      int
			closeErr *amqp.Error
			closedAt = -1 // returns received when the close error came
		)
		for returns != nil || closes != nil {
			select {
			case ret, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				if ret.MessageId != strconv.Itoa(got) {
					violations.add("round %d: return %d is message %q", r, got, ret.MessageId)
				}
				got++
			case err, ok := <-closes:
				if !ok {
					closes = nil
					continue
				}
				closeErr, closedAt = err, got
			case <-ctx.Done():
				t.Fatalf("round %d: listeners not closed within %v: %d returns, close error %v", r, runBound, got, closeErr)
			}
		}
		stop()
		switch {
		case closeErr == nil:
			t.Fatalf("round %d: NotifyClose closed without the broker's error", r)
		case closeErr.Code != amqp.NotFound:
			t.Fatalf("round %d: NotifyClose got %v, want 404 NOT_FOUND", r, closeErr)
		case got != n:
			violations.add("round %d: NotifyReturn closed after %d of %d returns", r, got, n)
		case closedAt != n:
			violations.add("round %d: NotifyClose got the error after %d of %d returns", r, closedAt, n)
		}
	}
	took := time.Since(start)
	t.Logf("%v: %d channel closes behind %d returns each in %s; violations: %d",
		mode, rounds, n, took.Round(time.Millisecond), violations.n)
	if violations.n > 0 {
		t.Errorf("%v: %d of %d channel closes overtook returns that came before them; violations: %v",
			mode, violations.n, rounds, &violations)
	}
}

// TestUnreadListenerStallsNobody: with channel A's NotifyReturn listener
// unread, channel B's RPCs and publish-and-confirm round trips complete
// promptly, and A's returns all arrive, in order, once read. This is the
// drainer's guarantee; upstream's reader (and a legacy reader) waits for
// the listener instead, so the other modes skip.
func TestUnreadListenerStallsNobody(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			if mode != compat.Drainer {
				t.Skipf("%v mode hands notifications over on its reader, which waits for an unread listener by design", mode)
			}
			unreadListenerStallsNobody(t, mode)
		})
	}
}

func unreadListenerStallsNobody(t *testing.T, mode compat.Mode) {
	const n, trips = 20, 200
	verifyNoLeaks(t)
	conn := dial(t, brokerURL(t), mode)
	a, b := testenv.Channel(t, conn), testenv.Channel(t, conn)
	q := testenv.ExclusiveQueue(t, b)
	unread := a.NotifyReturn(make(chan amqp.Return))
	nowhere := uniqueName(t, "nowhere")
	ctx, cancel := context.WithTimeout(context.Background(), runBound)
	defer cancel()
	for i := 0; i < n; i++ {
		if err := a.PublishWithContext(ctx, "", nowhere, true, false, amqp.Publishing{MessageId: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// No RPC on channel A to make sure its returns are in: the fix for
	// issue #16 may well hold A's later frames behind A's unread listener,
	// as upstream does. The returns come back while B works below.
	if err := b.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for i := 0; i < trips; i++ {
		start := time.Now()
		if _, err := b.QueueDeclarePassive(q, false, true, true, false, nil); err != nil {
			t.Fatalf("channel B's RPC %d: %v", i, err)
		}
		dc, err := b.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{})
		if err != nil {
			t.Fatalf("channel B's publish %d: %v", i, err)
		}
		wctx, wcancel := context.WithTimeout(ctx, bound)
		acked, err := dc.WaitContext(wctx)
		wcancel()
		if err != nil || !acked {
			t.Fatalf("channel B's confirmation %d: acked %v, %v (A's unread listener stalls B)", i, acked, err)
		}
		slowest = max(slowest, time.Since(start))
	}
	for i := 0; i < n; i++ {
		select {
		case r := <-unread:
			if r.MessageId != strconv.Itoa(i) {
				t.Fatalf("return %d of channel A is message %q", i, r.MessageId)
			}
		case <-time.After(bound):
			t.Fatalf("return %d of %d of channel A never arrived", i, n)
		}
	}
	t.Logf("%v: %d RPC + publish-and-confirm round trips on B behind A's unread NotifyReturn (%d returns waiting): slowest %s; all of A's returns arrived in order",
		mode, trips, n, slowest.Round(10*time.Microsecond))
	if slowest > 2*time.Second {
		t.Errorf("%v: channel B's slowest round trip took %s behind A's unread listener, want under 2s", mode, slowest)
	}
}
