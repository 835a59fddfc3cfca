package connfuzz

import (
	"errors"
	"fmt"
	"net"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// listenerCap is the buffer of every notification channel. Small, so that
// a burst of notifications fills it and the library's handling of a full
// listener is exercised, while listen keeps emptying it.
const listenerCap = 4

// listeners are the notification channels of the connection and of its
// one channel, plus the consumer's deliveries, which an application reads.
type listeners struct {
	deliveries <-chan amqp.Delivery
	confirms   chan amqp.Confirmation
	returns    chan amqp.Return
	chClose    chan *amqp.Error
	cancels    chan string
	flows      chan bool
	blocks     chan amqp.Blocking

	// mu guards the fields above once listen runs: listen sets each to
	// nil as the library closes it, and a failure message reads them.
	mu sync.Mutex
}

// newListeners registers every listener except the deliveries, which come
// from Consume.
func newListeners(conn *amqp.Connection, ch *amqp.Channel) *listeners {
	return &listeners{
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, listenerCap)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, listenerCap)),
		// NotifyClose sends at most one error, then closes; a buffer of
		// one is what upstream documents.
		chClose: ch.NotifyClose(make(chan *amqp.Error, 1)),
		cancels: ch.NotifyCancel(make(chan string, listenerCap)),
		flows:   ch.NotifyFlow(make(chan bool, listenerCap)),
		blocks:  conn.NotifyBlocked(make(chan amqp.Blocking, listenerCap)),
	}
}

// listen reads every listener as an attentive application does, acking
// each delivery, until the library has closed them all, which it does
// when the channel or the connection ends. Errors go to out.
func (l *listeners) listen(out *outcome) {
	for {
		l.mu.Lock()
		deliveries, confirms, returns, chClose, cancels, flows, blocks :=
			l.deliveries, l.confirms, l.returns, l.chClose, l.cancels, l.flows, l.blocks
		l.mu.Unlock()
		if deliveries == nil && confirms == nil && returns == nil && chClose == nil &&
			cancels == nil && flows == nil && blocks == nil {
			return
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				forget(&l.mu, &l.deliveries)
				continue
			}
			// The ack is a write from another goroutine than the reader,
			// concurrent with everything the stream triggers. It may fail
			// once the channel is gone, with an *amqp.Error or, as
			// upstream's Connection.send returns it, the socket's own
			// write error; it must not fail any other way.
			if err := d.Ack(false); !isWriteError(err) {
				out.add("Delivery.Ack", err)
			}
		case _, ok := <-confirms:
			if !ok {
				forget(&l.mu, &l.confirms)
			}
		case _, ok := <-returns:
			if !ok {
				forget(&l.mu, &l.returns)
			}
		case err, ok := <-chClose:
			if !ok {
				forget(&l.mu, &l.chClose)
			} else if err == nil {
				out.add("Channel.NotifyClose", fmt.Errorf("a nil *amqp.Error was sent"))
			}
		case _, ok := <-cancels:
			if !ok {
				forget(&l.mu, &l.cancels)
			}
		case _, ok := <-flows:
			if !ok {
				forget(&l.mu, &l.flows)
			}
		case _, ok := <-blocks:
			if !ok {
				forget(&l.mu, &l.blocks)
			}
		}
	}
}

// forget sets *c to nil under mu: the library closed that listener.
func forget[T any](mu *sync.Mutex, c *T) {
	mu.Lock()
	defer mu.Unlock()
	var zero T
	*c = zero
}

// open names the listeners not closed yet, for a failure message.
func (l *listeners) open() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for _, c := range []struct {
		name string
		open bool
	}{
		{"deliveries", l.deliveries != nil},
		{"NotifyPublish", l.confirms != nil},
		{"NotifyReturn", l.returns != nil},
		{"Channel.NotifyClose", l.chClose != nil},
		{"NotifyCancel", l.cancels != nil},
		{"NotifyFlow", l.flows != nil},
		{"NotifyBlocked", l.blocks != nil},
	} {
		if c.open {
			names = append(names, c.name)
		}
	}
	return names
}

// isWriteError reports whether err is what a write to the socket returns
// when it fails: upstream's Connection.send hands the *net.OpError of the
// failed write back to the caller (and shuts the connection down with an
// *amqp.Error that says the same), and every mode does likewise.
func isWriteError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "write"
}
