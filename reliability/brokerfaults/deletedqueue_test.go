package brokerfaults

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestDeletedQueue: another connection deletes the queue that consumers
// on two channels read. The broker cancels each consumer with
// basic.cancel; in every mode the application learns it from NotifyCancel
// and from its deliveries chan closing, and the channels stay open and
// usable, since a cancelled consumer is not a channel error.
func TestDeletedQueue(t *testing.T) {
	lvl := level.Require(t)
	// Full runs cancel more consumers at once, which upstream delivers
	// to NotifyCancel and the deliveries chans from its reader, one
	// after the other.
	perChannel := level.Pick(lvl, 2, 16)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { deletedQueue(t, mode, perChannel) })
	}
}

// channels is how many channels of the consuming connection hold
// consumers on the queue.
const channels = 2

func deletedQueue(t *testing.T, mode compat.Mode, perChannel int) {
	verifyNoLeaks(t)

	// The queue belongs to no connection, so that another one can delete
	// it: durable (RabbitMQ 4 refuses transient non-exclusive queues) and
	// set to expire, so that a killed run does not leave it behind.
	q := uniqueName(t, "queue")
	admin := testenv.Dial(t, amqp.Config{})
	adminCh := testenv.Channel(t, admin)
	if _, err := adminCh.QueueDeclare(q, true, false, false, false, amqp.Table{"x-expires": int32(10 * time.Minute / time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A no-op when the test got as far as deleting it.
		if ch, err := admin.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	})

	name := uniqueName(t, "conn")
	conn := dial(t, mode, name)
	drained := drainLoop(t, conn, mode)

	type consumer struct {
		tag    string
		closed chan struct{} // closed when its deliveries chan is
	}
	type channel struct {
		ch        *amqp.Channel
		cancels   <-chan string
		closes    <-chan *amqp.Error
		consumers []consumer
	}
	var (
		chans     []channel
		delivered = make(chan string, channels*perChannel)
	)
	for i := 0; i < channels; i++ {
		ch := testenv.Channel(t, conn)
		c := channel{
			ch: ch,
			// Buffered for every consumer of the channel: upstream's
			// reader waits for a NotifyCancel receiver.
			cancels: ch.NotifyCancel(make(chan string, perChannel)),
			closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
		}
		for j := 0; j < perChannel; j++ {
			tag := fmt.Sprintf("%s-ch%d-c%d", name, i, j)
			deliveries, err := ch.Consume(q, tag, true, false, false, false, nil)
			if err != nil {
				t.Fatalf("consume as %s: %v", tag, err)
			}
			cons := consumer{tag, make(chan struct{})}
			go func() {
				defer close(cons.closed)
				for d := range deliveries {
					delivered <- d.ConsumerTag
				}
			}()
			c.consumers = append(c.consumers, cons)
		}
		chans = append(chans, c)
	}

	// The consumers work before the fault: every message published
	// reaches one of them.
	n := channels * perChannel
	for i := 0; i < n; i++ {
		if err := adminCh.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("before")}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		select {
		case <-delivered:
		case <-time.After(bound):
			t.Fatalf("%d of %d messages delivered within %v before the queue was deleted", i, n, bound)
		}
	}

	start := time.Now()
	if _, err := adminCh.QueueDelete(q, false, false, false); err != nil {
		t.Fatalf("delete the queue from another connection: %v", err)
	}

	var cancelled, closed time.Duration
	for i, c := range chans {
		var got, want []string
		for _, cons := range c.consumers {
			want = append(want, cons.tag)
			select {
			case tag := <-c.cancels:
				got = append(got, tag)
			case <-time.After(bound):
				t.Fatalf("channel %d: NotifyCancel got %q within %v of the queue's deletion, want %d tags", i, got, bound, len(c.consumers))
			}
		}
		cancelled = max(cancelled, time.Since(start))
		sort.Strings(got)
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("channel %d: NotifyCancel got %q, want the consumer tags %q", i, got, want)
		}
		for _, cons := range c.consumers {
			select {
			case <-cons.closed:
			case <-time.After(bound):
				t.Fatalf("%s: the deliveries chan did not close within %v of the queue's deletion", cons.tag, bound)
			}
		}
		closed = max(closed, time.Since(start))
	}

	// A cancelled consumer is not a channel error: each channel stays
	// open, and serves an RPC and a publish-and-get round trip.
	var usable time.Duration
	for i, c := range chans {
		select {
		case err := <-c.closes:
			t.Fatalf("channel %d closed after the cancel: %v", i, err)
		default:
		}
		took, err := timed(t, bound, "a round trip on a channel after the cancel", func() error {
			return roundTrip(c.ch)
		})
		if err != nil {
			t.Fatalf("channel %d after the cancel: %v", i, err)
		}
		usable = max(usable, took)
	}

	var closeTook time.Duration
	for i, c := range chans {
		took, err := timed(t, bound, "Channel.Close after the cancel", c.ch.Close)
		if err != nil {
			t.Errorf("channel %d: Close: %v", i, err)
		}
		closeTook = max(closeTook, took)
	}
	took, err := timed(t, bound, "Connection.Close after the cancel", conn.Close)
	if err != nil {
		t.Errorf("Connection.Close: %v", err)
	}
	closeTook = max(closeTook, took)
	if err := drained(); mode == compat.Legacy && !errors.Is(err, amqp.ErrClosedIntentionally) {
		t.Errorf("the drain loop ended with %v, want ErrClosedIntentionally", err)
	}
	t.Logf("%v: %d consumers on %d channels cancelled in %s, deliveries closed in %s, round trip after it %s, Close %s",
		mode, n, channels, ms(cancelled), ms(closed), ms(usable), ms(closeTook))
}

// roundTrip declares a queue (an RPC), publishes to it and gets the
// message back.
func roundTrip(ch *amqp.Channel) error {
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("declare: %w", err)
	}
	if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false, amqp.Publishing{Body: []byte("after")}); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	// The broker routes a publish asynchronously: poll until it is in.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(bound); ; <-tick.C {
		d, ok, err := ch.Get(q.Name, true)
		switch {
		case err != nil:
			return fmt.Errorf("get: %w", err)
		case ok && string(d.Body) == "after":
			return nil
		case ok:
			return fmt.Errorf("get = %q, want the message just published", d.Body)
		case time.Now().After(deadline):
			return fmt.Errorf("the message published was not there to get within %v", bound)
		}
	}
}
