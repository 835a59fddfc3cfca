package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/ledger"
)

// confirmBound is how long one confirmation may take; a confirmation that
// takes longer counts as silently dropped and fails the soak.
const confirmBound = 30 * time.Second

// redialPause paces redials while a reset toxic is in place: pacing, not
// synchronisation.
const redialPause = 50 * time.Millisecond

// sleepCtx waits d or until ctx ends, whichever comes first; it paces
// workers and never stands in for waiting on a condition.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// A publisher is a user-style publisher with confirms: on a lost
// connection it redials, reopens its channel in confirm mode and
// republishes every message whose confirmation was not an ack. It
// publishes new IDs at most once per pace, until stop; then it finishes
// its retries and returns. It runs in one goroutine; only its counters
// are shared.
type publisher struct {
	idx    int
	url    string
	queue  string
	led    *ledger.Ledger
	pace   time.Duration
	window int

	retry  []ledger.ID
	fresh  int
	losses atomic.Int64
}

type inflight struct {
	id ledger.ID
	dc *amqp.DeferredConfirmation
}

// errLost says a session ended because its connection was lost.
var errLost = errors.New("connection lost")

// run publishes until stop is closed and every ID is acked, or until ctx
// ends (the test failed, or the retries took too long).
func (p *publisher) run(ctx context.Context, stop <-chan struct{}) error {
	tick := time.NewTicker(p.pace)
	defer tick.Stop()
	for {
		conn, err := drainer.DialConfig(p.url, amqp.Config{}, drainer.Options{})
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("publisher %d: %w (last dial: %v)", p.idx, ctx.Err(), err)
			}
			sleepCtx(ctx, redialPause)
			continue
		}
		err = p.session(ctx, stop, tick.C, conn)
		_ = conn.Close()
		if !errors.Is(err, errLost) {
			return err
		}
		p.losses.Add(1)
	}
}

// session publishes on one connection; every confirmation owed is settled
// before it returns, so the books balance whatever the outcome.
func (p *publisher) session(ctx context.Context, stop <-chan struct{}, tick <-chan time.Time, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		return fmt.Errorf("%w: open a confirm channel: %w", errLost, err)
	}
	var fl []inflight
	settleAll := func() {
		for _, f := range fl {
			p.settle(ctx, f, conn)
		}
	}
	for {
		for len(fl) < p.window {
			id, ok := p.next(ctx, stop, tick, len(fl) == 0)
			if !ok {
				break
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", p.queue, false, false, amqp.Publishing{
				MessageId:    id.String(),
				Body:         []byte(id.String()),
				DeliveryMode: amqp.Persistent,
			})
			if err != nil {
				p.led.PublishFailed(id)
				p.retry = append(p.retry, id)
				settleAll()
				if ctx.Err() != nil {
					return fmt.Errorf("publisher %d: %w", p.idx, ctx.Err())
				}
				return fmt.Errorf("%w: publish: %w", errLost, err)
			}
			p.led.Published(id)
			fl = append(fl, inflight{id, dc})
		}
		if len(fl) == 0 {
			if ctx.Err() != nil {
				return fmt.Errorf("publisher %d: %w with %d IDs still to republish", p.idx, ctx.Err(), len(p.retry))
			}
			return nil
		}
		f := fl[0]
		fl = fl[1:]
		if !p.settle(ctx, f, conn) && conn.IsClosed() {
			settleAll()
			return fmt.Errorf("%w: confirmation for %v not acked", errLost, f.id)
		}
	}
}

// next returns the next ID to publish: a republish at once, a new ID on
// the pace's next tick. With confirmations in flight (idle false) it does
// not wait for the tick but returns false, so that the caller settles the
// oldest meanwhile. False too once stop is closed and nothing is left to
// republish, or when ctx ends.
func (p *publisher) next(ctx context.Context, stop <-chan struct{}, tick <-chan time.Time, idle bool) (ledger.ID, bool) {
	if ctx.Err() != nil {
		return ledger.ID{}, false
	}
	if len(p.retry) > 0 {
		id := p.retry[0]
		p.retry = p.retry[1:]
		return id, true
	}
	if !idle {
		// Something is in flight: do not wait for the pace here, settle
		// it first (the caller's loop returns to it).
		select {
		case <-tick:
		default:
			return ledger.ID{}, false
		}
	} else {
		select {
		case <-tick:
		case <-stop:
			return ledger.ID{}, false
		case <-ctx.Done():
			return ledger.ID{}, false
		}
	}
	select {
	case <-stop:
		return ledger.ID{}, false
	default:
	}
	p.fresh++
	return ledger.ID{Pub: p.idx, Seq: p.fresh}, true
}

// settle waits, within confirmBound, for one confirmation and books it;
// it reports whether it was an ack.
func (p *publisher) settle(ctx context.Context, f inflight, conn *amqp.Connection) bool {
	wctx, cancel := context.WithTimeout(ctx, confirmBound)
	defer cancel()
	ok, err := f.dc.WaitContext(wctx)
	switch {
	case err != nil:
		p.led.Outstanding(f.id)
	case ok:
		p.led.Acked(f.id)
		return true
	default:
		p.led.Nacked(f.id, conn.IsClosed())
	}
	p.retry = append(p.retry, f.id)
	return false
}

// A consumer consumes the queue with manual acks and records every
// delivery in found, redialling whenever its connection is lost, until
// stop. Deliveries are recorded on receipt: a delivery proves the broker
// had the message, whether or not the ack gets back.
type consumer struct {
	idx      int
	url      string
	queue    string
	found    *ledger.Found
	prefetch int
	losses   atomic.Int64
}

func (c *consumer) run(ctx context.Context, stop <-chan struct{}) error {
	return redial(ctx, stop, c.url, fmt.Sprintf("consumer %d", c.idx), &c.losses, c.session)
}

// session consumes on one connection; it reports whether it ended because
// of stop (or ctx) rather than a loss.
func (c *consumer) session(ctx context.Context, stop <-chan struct{}, conn *amqp.Connection) bool {
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(c.prefetch, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(c.queue, "", false, false, false, false, nil)
	}
	if err != nil {
		return false
	}
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return false
			}
			c.found.Add(d.MessageId)
			_ = d.Ack(false) // a lost ack means a redelivery: a counted duplicate
		case <-stop:
			return true
		case <-ctx.Done():
			return true
		}
	}
}

// A churner opens and closes channels at random on one connection, each
// new channel doing one RPC, so that channel ids are allocated and
// released all through the soak; on a lost connection it redials.
// Its errors are counted, not failures: a channel operation may race a
// reset.
//
// It does not use upstream's automatic recovery: closing channels on a
// recovering connection poisons the recovery (TestChannelCloseDuringRecovery),
// and with Close racing recovery upstream also leaks the watchChannel
// goroutine of some channels (see the package documentation), which would
// fail this soak on upstream's account rather than the drainer's.
type churner struct {
	url     string
	queue   string
	rng     *rand.Rand
	maxOpen int

	opened, closed, errs atomic.Int64
	losses               atomic.Int64
}

func (c *churner) run(ctx context.Context, stop <-chan struct{}) error {
	return redial(ctx, stop, c.url, "churner", &c.losses, c.session)
}

// redial runs session on a fresh drainer connection until stop is closed
// or ctx ends, counting each connection the session reports lost in
// losses. session reports whether it ended because of stop or ctx.
func redial(ctx context.Context, stop <-chan struct{}, url, who string, losses *atomic.Int64,
	session func(context.Context, <-chan struct{}, *amqp.Connection) bool) error {
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", who, ctx.Err())
		default:
		}
		conn, err := drainer.DialConfig(url, amqp.Config{}, drainer.Options{})
		if err != nil {
			sleepCtx(ctx, redialPause)
			continue
		}
		done := session(ctx, stop, conn)
		_ = conn.Close()
		if done {
			return nil
		}
		losses.Add(1)
	}
}

// session churns on one connection; it reports whether it ended because
// of stop (or ctx) rather than a lost connection.
func (c *churner) session(ctx context.Context, stop <-chan struct{}, conn *amqp.Connection) bool {
	var open []*amqp.Channel
	for {
		select {
		case <-stop:
			for _, ch := range open {
				_ = ch.Close()
			}
			return true
		case <-ctx.Done():
			return true
		default:
		}
		if conn.IsClosed() {
			return false
		}
		sleepCtx(ctx, time.Duration(5+c.rng.IntN(45))*time.Millisecond)
		if len(open) < c.maxOpen && (len(open) == 0 || c.rng.IntN(2) == 0) {
			ch, err := conn.Channel()
			if err != nil {
				c.errs.Add(1)
				continue
			}
			c.opened.Add(1)
			open = append(open, ch)
			if _, err := ch.QueueDeclarePassive(c.queue, true, false, false, false, nil); err != nil {
				c.errs.Add(1)
			}
			continue
		}
		i := c.rng.IntN(len(open))
		if err := open[i].Close(); err != nil {
			c.errs.Add(1)
		}
		c.closed.Add(1)
		open = append(open[:i], open[i+1:]...)
	}
}
