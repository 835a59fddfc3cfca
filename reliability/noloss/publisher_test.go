package noloss

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/ledger"
)

// A publisher publishes uniquely numbered messages with confirms, keeps up
// to window of them in flight, and republishes every one whose
// confirmation is not an ack, until each ID is acked. It runs in one
// goroutine; only stop, acks and losses are shared with the test.
type publisher struct {
	led    *ledger.Ledger
	queue  string
	window int
	// bound is how long a confirmation may take. Past it the confirmation
	// counts as outstanding, that is silently dropped, and the test fails.
	bound time.Duration
	// giveUp is when the publisher stops retrying and returns an error,
	// so that a broken run ends instead of hanging the test binary.
	giveUp time.Time
	stop   chan struct{} // closed by the test: publish no new IDs, finish the retries
	// ctx ends the publisher at once, when the test has already failed
	// and must not leave it running.
	ctx    context.Context
	cancel context.CancelFunc

	retry  []ledger.ID // IDs to publish again, oldest first
	fresh  int         // the last new ID's number
	losses atomic.Int64
	notes  []string // what the publisher observed, for the test log
}

// inflight is a publish whose confirmation is owed.
type inflight struct {
	id ledger.ID
	dc *amqp.DeferredConfirmation
}

func newPublisher(led *ledger.Ledger, queue string, bound, giveUp time.Duration) *publisher {
	ctx, cancel := context.WithCancel(context.Background())
	return &publisher{
		led:    led,
		queue:  queue,
		window: 32,
		bound:  bound,
		giveUp: time.Now().Add(giveUp),
		stop:   make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
	}
}

// start runs run in its own goroutine and returns a chan that yields its
// result. If the test ends first (it failed), a cleanup aborts the
// publisher and waits for it, so that no goroutine outlives the test.
func (p *publisher) start(t *testing.T, run func() error) <-chan error {
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		done <- run()
	}()
	t.Cleanup(func() {
		p.cancel()
		select {
		case <-exited:
		case <-time.After(p.bound + time.Minute):
			t.Errorf("the publisher did not stop within %v of being aborted", p.bound+time.Minute)
		}
	})
	return done
}

// nextID returns the next ID to publish, republishes first; false once
// the test has said stop and nothing is left to republish.
func (p *publisher) nextID() (ledger.ID, bool) {
	if p.ctx.Err() != nil {
		return ledger.ID{}, false
	}
	if len(p.retry) > 0 {
		id := p.retry[0]
		p.retry = p.retry[1:]
		return id, true
	}
	select {
	case <-p.stop:
		return ledger.ID{}, false
	default:
	}
	p.fresh++
	return ledger.ID{Seq: p.fresh}, true
}

func (p *publisher) publish(ch *amqp.Channel, id ledger.ID) (*amqp.DeferredConfirmation, error) {
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", p.queue, false, false, amqp.Publishing{
		MessageId:    id.String(),
		Body:         []byte(id.String()),
		DeliveryMode: amqp.Persistent,
	})
	if err != nil {
		p.led.PublishFailed(id)
		p.retry = append(p.retry, id)
		return nil, err
	}
	if dc == nil {
		// Only a channel not in confirm mode returns no confirmation; a
		// recovered channel must have been put back in confirm mode.
		return nil, errors.New("publish returned a nil DeferredConfirmation: the channel is not in confirm mode")
	}
	p.led.Published(id)
	return dc, nil
}

// settle waits, within bound, for one confirmation and books it; it
// reports whether it was an ack. lost says whether a "not acked" came from
// losing the connection rather than from a broker nack.
func (p *publisher) settle(f inflight, lost func() bool) bool {
	ctx, cancel := context.WithTimeout(p.ctx, p.bound)
	defer cancel()
	ok, err := f.dc.WaitContext(ctx)
	switch {
	case err != nil && !errors.Is(err, amqp.ErrStaleConfirmation):
		p.led.Outstanding(f.id)
		p.note("confirmation for %s (tag %d) outstanding after %v: %v", f.id, f.dc.DeliveryTag, p.bound, err)
	case ok:
		p.led.Acked(f.id)
		return true
	default:
		// Not acked: nacked, or (ErrStaleConfirmation, with safe recovery
		// as in drainer mode) ended by recovery's reset of the channel.
		// lost also follows the channel into its recovery, which
		// runRecovery then waits out.
		p.led.Nacked(f.id, lost())
	}
	// Not positively confirmed: the broker may or may not have it, so it
	// goes out again (at-least-once).
	p.retry = append(p.retry, f.id)
	return false
}

// settleAll settles every confirmation still owed, oldest first.
func (p *publisher) settleAll(fl []inflight, lost func() bool) {
	for _, f := range fl {
		p.settle(f, lost)
	}
}

// session publishes on ch until the test says stop and every ID is acked
// (it returns nil), or until the connection is lost (errLost) or the
// publisher gives up. Every confirmation owed is settled before it
// returns, so the books balance whatever the outcome.
func (p *publisher) session(ch *amqp.Channel, lost func() bool) error {
	var fl []inflight
	for {
		if p.ctx.Err() != nil || time.Now().After(p.giveUp) {
			p.settleAll(fl, lost)
			return errors.New("publisher gave up or was aborted: not every message was acked")
		}
		for len(fl) < p.window {
			id, ok := p.nextID()
			if !ok {
				break
			}
			dc, err := p.publish(ch, id)
			if err != nil {
				p.settleAll(fl, lost)
				return fmt.Errorf("%w: publish: %w", errLost, err)
			}
			fl = append(fl, inflight{id, dc})
		}
		if len(fl) == 0 {
			if p.ctx.Err() != nil {
				return p.ctx.Err()
			}
			return nil
		}
		f := fl[0]
		fl = fl[1:]
		if !p.settle(f, lost) && lost() {
			p.settleAll(fl, lost)
			return fmt.Errorf("%w: confirmation for %s not acked", errLost, f.id)
		}
	}
}

// errLost says a session ended because its connection was lost.
var errLost = errors.New("connection lost")

func (p *publisher) note(format string, args ...any) {
	if len(p.notes) < 20 {
		p.notes = append(p.notes, fmt.Sprintf(format, args...))
	}
}

// pause waits d between redials: pacing, not synchronisation.
func (p *publisher) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.ctx.Done():
	}
}

// runRetryLoop is the user-style publisher without automatic recovery: on
// a lost connection it redials, reopens a channel, puts it in confirm mode
// and republishes whatever was not positively confirmed.
func (p *publisher) runRetryLoop(url string) error {
	for {
		conn, ch, err := p.dialConfirm(url, amqp.Config{})
		if err != nil {
			if p.ctx.Err() != nil || time.Now().After(p.giveUp) {
				return fmt.Errorf("publisher gave up redialling: %w", err)
			}
			p.pause(50 * time.Millisecond)
			continue
		}
		err = p.session(ch, conn.IsClosed)
		_ = conn.Close()
		if !errors.Is(err, errLost) {
			return err
		}
		p.losses.Add(1)
	}
}

func (p *publisher) dialConfirm(url string, cfg amqp.Config) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := drainer.DialConfig(url, cfg, drainer.Options{})
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// runRecovery is the publisher on a connection with upstream's automatic
// recovery: it never redials. After a loss it waits for the channel's
// StateOpen notification, as upstream's Reconnect documentation asks, and
// republishes on the same channel. Waiting matters: the confirmations owed
// at the loss are resolved while recovery is reopening the channel, and a
// publish at that moment races recovery's own channel.open and
// confirm.select (TestNaiveRepublishDuringRecovery).
func (p *publisher) runRecovery(ch *amqp.Channel, st *chanStates) error {
	for {
		err := p.session(ch, func() bool { return st.lost(p.ctx, p.bound) })
		if !errors.Is(err, errLost) {
			return err
		}
		p.losses.Add(1)
		if err := st.awaitOpen(p.ctx, p.bound); err != nil {
			return err
		}
	}
}

// chanStates follows a channel's NotifyStateChange notifications in the
// publisher's goroutine. Delivery is asynchronous but in order, so a
// Reconnecting seen here may lag the library by a little, never reorder.
type chanStates struct {
	events     chan *amqp.StateChanged
	recovering bool // a Reconnecting has been seen and no Open since
	recoveries int  // Reconnecting→Open transitions seen
}

func newChanStates(ch *amqp.Channel) *chanStates {
	// Buffered generously: upstream's delivery goroutine blocks on a full
	// chan, and the last notifications arrive after the publisher is gone.
	st := &chanStates{events: make(chan *amqp.StateChanged, 1024)}
	ch.NotifyStateChange(st.events)
	return st
}

func (s *chanStates) apply(e *amqp.StateChanged) {
	switch e.To {
	case amqp.StateReconnecting:
		s.recovering = true
	case amqp.StateOpen:
		if s.recovering {
			s.recoveries++
		}
		s.recovering = false
	}
}

// lost says whether a "not acked" came from a lost connection: the
// channel is, or within bound goes, into recovery. A broker nack on a
// live channel is followed by no recovery, so it costs the whole bound;
// RabbitMQ does not nack in these runs.
func (s *chanStates) lost(ctx context.Context, bound time.Duration) bool {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for !s.recovering {
		select {
		case e, ok := <-s.events:
			if !ok {
				return true // closed for good: certainly lost
			}
			s.apply(e)
		case <-timer.C:
			return false
		case <-ctx.Done():
			return true
		}
	}
	return true
}

// awaitOpen waits, within bound, for the recovery under way to reopen the
// channel.
func (s *chanStates) awaitOpen(ctx context.Context, bound time.Duration) error {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for s.recovering {
		select {
		case e, ok := <-s.events:
			if !ok {
				return errors.New("the channel closed for good during recovery")
			}
			s.apply(e)
		case <-timer.C:
			return fmt.Errorf("recovery did not reopen the channel within %v", bound)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
