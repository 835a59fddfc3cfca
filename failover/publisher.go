package failover

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// PublisherOptions configure a Publisher. Only Dial is required.
type PublisherOptions struct {
	// Dial opens each connection; see DialFunc for the endpoint order.
	Dial DialFunc

	// MaxOutstanding bounds the messages accepted and not yet settled
	// (confirmed, failed or abandoned by their caller). Publish blocks,
	// bounded by its ctx, at the limit. Default 1000.
	MaxOutstanding int

	// ConfirmTimeout: when the oldest unconfirmed message on the current
	// channel has waited this long, the connection is abandoned (closed
	// without waiting for the broker) and its unconfirmed messages are
	// republished on the next one. 0 disables the watchdog.
	//
	// Consecutive abandonments back off: after an abandonment, and until
	// the broker acks a message again, the timeout in force doubles with
	// each abandonment, up to MaxConfirmTimeout. A stall that follows the
	// publisher from node to node is the broker's own: a quorum queue
	// whose leader was on a node cut from its peers confirms nothing, on
	// any node, until the others notice the cut (0.75–1.25 ×
	// net_ticktime) and elect a new leader. A fixed timeout shorter than
	// that abandons the next node too, shortly before it would have
	// answered, and every abandonment spends one of MaxAttempts of each
	// unconfirmed message (measured in the cluster suite's fault 5pmL,
	// ConfirmTimeout 2 s, net_ticktime 5: with a fixed timeout, 2
	// abandonments in 4 runs of 4 and messages failed in 2; with the
	// backoff, 1 abandonment in 3 of 3 and none failed). A nack does not
	// reset the backoff: the queue answering without taking the message
	// is that same election. On a connection whose node answered a
	// silent probe's channel.open (see the package doc, "The silent
	// channel"), the timeout in force is MaxConfirmTimeout.
	ConfirmTimeout time.Duration

	// MaxConfirmTimeout caps the backed-off confirm timeout (see
	// ConfirmTimeout), and is the timeout of a node that answered a silent
	// probe's reopen. Default 4 × ConfirmTimeout: the first node is given
	// ConfirmTimeout; the next one, once it answers the channel.open that
	// replaces its silent probe, 4× (a node that does not answer is left
	// at once). So a broker that needs up to 5 × ConfirmTimeout to confirm
	// again costs one abandonment (the cluster suite's frozen leader: up
	// to 4.9 ×), while a node that will never confirm (a cut node that
	// DialFunc came back to) holds the publisher 4 × ConfirmTimeout at
	// most, not the minutes a partition may last. Past the cap each
	// further abandonment costs a reconnection and a republish, which is
	// cheap. A value other than 0 at or below ConfirmTimeout turns the
	// backoff off.
	MaxConfirmTimeout time.Duration

	// MaxAttempts bounds how many times one message is published (first
	// publish, republishes after nacks and failovers). The attempt after
	// which it is nacked or lost once more fails its Publish with ErrNacked
	// or ErrGaveUp. Default 10.
	MaxAttempts int

	// KeepChannelOnNack republishes a nacked message on the same channel.
	// By default (false) a nack retires the channel: a new channel on the
	// same connection takes over, and every unconfirmed message of the old
	// one is republished on it. That is what ends RabbitMQ's nack storm
	// after a quorum-queue leader election (see the package doc).
	KeepChannelOnNack bool

	// Backoff paces redials, and channel reopens with no confirmation
	// between them (capped in a nack storm; see the package doc).
	Backoff Backoff

	// SetupTimeout bounds opening a channel and confirm.select on a new
	// connection; past it the connection is abandoned. Default 10s.
	SetupTimeout time.Duration

	// CloseTimeout bounds Close. Default 5s.
	CloseTimeout time.Duration

	// Logger receives warnings about failovers; nil is silent.
	Logger *slog.Logger

	// OnEvent, if set, is called for every Event, synchronously.
	OnEvent func(Event)
}

// PublisherStats are cumulative counts, and two figures of the moment
// (Outstanding, ConfirmTimeoutNow).
type PublisherStats struct {
	Published      uint64 // basic.publish frames written, republishes included
	Confirmed      uint64 // messages acked by the broker
	Nacks          uint64 // basic.nack received
	Republished    uint64 // publishes of a message that had gone out before
	Failovers      uint64 // connections lost or abandoned while in use
	ChannelReopens uint64 // channels replaced on the same connection
	SilentReopens  uint64 // of which, probe channels that answered nothing (see ConfirmTimeout)
	Abandons       uint64 // connections abandoned by the ConfirmTimeout watchdog
	Failed         uint64 // messages that failed with ErrNacked or ErrGaveUp
	Connects       uint64 // channels set up in confirm mode: on a new connection, or reopened
	Outstanding    int    // messages accepted and not yet settled, now

	// ConfirmTimeoutNow is the confirm timeout in force: ConfirmTimeout,
	// or longer after consecutive abandonments, and MaxConfirmTimeout once
	// a node answered a silent probe's reopen (see
	// PublisherOptions.ConfirmTimeout); 0 when the watchdog is off.
	ConfirmTimeoutNow time.Duration
	// AbandonStreak counts the abandonments since the broker last acked a
	// message; an ack resets it to 0.
	AbandonStreak int
}

// Publisher publishes with publisher confirms over a connection that it
// replaces when it fails. See the package doc for the guarantees.
type Publisher struct {
	o      PublisherOptions
	n      notifier
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	slots  chan struct{}
	wake   chan struct{} // cap 1: the sender has work
	done   chan struct{} // the manager returned

	idPrefix string
	idSeq    atomic.Uint64

	closeOnce sync.Once
	wg        sync.WaitGroup // every goroutine but the manager

	mu     sync.Mutex
	closed bool
	queue  *list.List // *message waiting to be published
	cur    *chanGen
	stats  PublisherStats
	conn   *connGen // the current connection, for Close
}

type message struct {
	exchange, key string
	mandatory     bool
	msg           amqp.Publishing
	done          chan error // cap 1

	attempts  int
	lastNack  bool
	cancelled bool // the caller stopped waiting
	settled   bool
	qelem     *list.Element // in p.queue
	gen       *chanGen      // in gen.inflight
	tag       uint64
	sentAt    time.Time     // put in flight on gen
	oelem     *list.Element // in gen.order
	// waitingSince: first put in flight on this connection, or since its
	// last answer; the confirm timeout counts from it (overdue). A silent
	// probe's reopen keeps it (keepWaiting), so reopens that stay silent
	// still end in an abandonment; a nack, an answer, starts it again.
	waitingSince time.Time
	waitConn     *connGen // the connection waitingSince is on
	keepWaiting  bool
}

// connGen is one connection.
type connGen struct {
	conn  *amqp.Connection
	drain *drainLoop
	lost  chan *amqp.Error
}

// chanGen is one channel generation: its delivery tags mean something
// only to it.
type chanGen struct {
	cg       *connGen
	ch       *amqp.Channel
	inflight map[uint64]*message
	order    *list.List // inflight messages in publish order, oldest first
	dead     bool
	failed   chan struct{} // closed by fail
	failErr  error
	nacked   bool // failed because of a nack: reopen the channel
	// probe: opened during a nack storm, g carries one message at a
	// time until the broker acks one (see reopenDelay).
	probe probeKind
}

// probeKind says what a channel opened during a nack storm carries.
type probeKind int

const (
	noProbe      probeKind = iota // every queued message
	probeFree                     // one at a time; a nack is not charged to MaxAttempts
	probeCharged                  // one at a time; a nack is charged
)

// fail ends g's use, once; the manager then retires it. Caller holds p.mu.
func (g *chanGen) fail(err error, nack bool) {
	if g.failErr != nil || g.dead {
		return
	}
	g.failErr, g.nacked = err, nack
	close(g.failed)
}

// withDefaults fills in the options left at zero.
func (o PublisherOptions) withDefaults() PublisherOptions {
	if o.MaxOutstanding <= 0 {
		o.MaxOutstanding = 1000
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 10
	}
	if o.SetupTimeout <= 0 {
		o.SetupTimeout = 10 * time.Second
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 5 * time.Second
	}
	if o.ConfirmTimeout < 0 {
		o.ConfirmTimeout = 0
	}
	if o.MaxConfirmTimeout == 0 {
		o.MaxConfirmTimeout = 4 * o.ConfirmTimeout
	}
	o.MaxConfirmTimeout = max(o.MaxConfirmTimeout, o.ConfirmTimeout)
	o.Backoff = o.Backoff.withDefaults()
	return o
}

// NewPublisher dials the first connection (bounded by ctx) and returns a
// Publisher that keeps one open until Close.
func NewPublisher(ctx context.Context, o PublisherOptions) (*Publisher, error) {
	if o.Dial == nil {
		return nil, errors.New("failover: PublisherOptions.Dial is required")
	}
	o = o.withDefaults()
	var idb [6]byte
	_, _ = rand.Read(idb[:])
	pctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{
		o:        o,
		n:        newNotifier(o.Logger, o.OnEvent),
		ctx:      pctx,
		cancel:   cancel,
		slots:    make(chan struct{}, o.MaxOutstanding),
		wake:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		idPrefix: hex.EncodeToString(idb[:]) + "-",
		queue:    list.New(),
	}
	p.stats.ConfirmTimeoutNow = o.ConfirmTimeout
	// The first connection is set up here, so that a wrong URL fails
	// NewPublisher instead of retrying forever.
	first, err := p.o.Dial(ctx)
	if err == nil && first == nil {
		err = errors.New("failover: DialFunc returned no connection and no error")
	}
	if err == nil && first.IsRecoveryEnabled() {
		abandon(first)
		err = ErrRecoveryEnabled
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("failover: first dial: %w", err)
	}
	cg := p.startConn(first)
	stop := context.AfterFunc(ctx, func() { closeConn(cg.conn, cg.drain, time.Now()) })
	g, err := p.openChannel(cg, noProbe, p.o.SetupTimeout)
	stop()
	if err != nil {
		p.retireConn(cg)
		cancel()
		p.wg.Wait()
		return nil, fmt.Errorf("failover: first channel: %w", err)
	}
	go p.run(cg, g)
	return p, nil
}

// Publish publishes msg and waits for the broker's confirmation.
//
// It returns nil once the broker confirmed msg; an error wrapping ErrNacked
// or ErrGaveUp once it failed MaxAttempts times; ctx's error
// (errors.Is(err, ctx.Err())) if ctx ends first, in which case the message
// may or may not have reached the queue; and an error that Is
// amqp.ErrClosed after Close. An empty msg.MessageId is replaced by a
// unique one, which every republish of the message keeps. Safe for
// concurrent use.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, mandatory bool, msg amqp.Publishing) error {
	if err := validate(exchange, key, &msg); err != nil {
		return err
	}
	if msg.MessageId == "" {
		msg.MessageId = p.idPrefix + fmt.Sprint(p.idSeq.Add(1))
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("failover: publish: waiting for one of %d outstanding slots: %w", p.o.MaxOutstanding, ctx.Err())
	case <-p.ctx.Done():
		return errClosed
	}
	m := &message{exchange: exchange, key: key, mandatory: mandatory, msg: msg, done: make(chan error, 1)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.slots
		return errClosed
	}
	m.qelem = p.queue.PushBack(m)
	p.stats.Outstanding++
	p.mu.Unlock()
	p.kick()

	select {
	case err := <-m.done:
		return err
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.settled {
		return <-m.done
	}
	m.cancelled = true
	if m.qelem != nil { // not on the wire: drop it
		p.queue.Remove(m.qelem)
		m.qelem = nil
		p.settle(m, nil)
	}
	return fmt.Errorf("failover: publish of message %s: %w", msg.MessageId, ctx.Err())
}

// validate refuses what would fail the connection rather than the message:
// upstream shuts a connection down on a short string over 255 octets.
func validate(exchange, key string, msg *amqp.Publishing) error {
	if err := msg.Headers.Validate(); err != nil {
		return fmt.Errorf("failover: publish: %w", err)
	}
	for name, s := range map[string]string{
		"exchange": exchange, "routing key": key, "ContentType": msg.ContentType,
		"ContentEncoding": msg.ContentEncoding, "CorrelationId": msg.CorrelationId,
		"ReplyTo": msg.ReplyTo, "Expiration": msg.Expiration, "MessageId": msg.MessageId,
		"Type": msg.Type, "UserId": msg.UserId, "AppId": msg.AppId,
	} {
		if len(s) > 255 {
			return fmt.Errorf("failover: publish: %s is %d octets, the limit is 255", name, len(s))
		}
	}
	return nil
}

func (p *Publisher) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// settle ends m with err and frees its slot. Caller holds p.mu.
func (p *Publisher) settle(m *message, err error) {
	if m.settled {
		return
	}
	m.settled = true
	m.done <- err
	p.stats.Outstanding--
	<-p.slots
}

// requeue puts m, taken off the wire, back to be published again, or
// fails it after MaxAttempts. Caller holds p.mu.
func (p *Publisher) requeue(m *message, cause error, front bool) {
	m.gen, m.oelem = nil, nil
	switch {
	case m.cancelled:
		p.settle(m, nil)
	case m.attempts >= p.o.MaxAttempts:
		sentinel := ErrGaveUp
		if m.lastNack {
			sentinel = ErrNacked
		}
		err := fmt.Errorf("%w: message %s after %d attempts, last: %v", sentinel, m.msg.MessageId, m.attempts, cause)
		p.stats.Failed++
		p.n.log.Warn("failover: message failed", "id", m.msg.MessageId, "err", err)
		p.n.emit(Event{Kind: EventFailed, MessageID: m.msg.MessageId, Err: err})
		p.settle(m, err)
	case front:
		m.qelem = p.queue.PushFront(m)
	default:
		m.qelem = p.queue.PushBack(m)
	}
}

// Stats returns a snapshot of the counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops the publisher within CloseTimeout: pending Publish calls
// return an error that Is amqp.ErrClosed, and the connection is closed
// (waiting at most CloseTimeout for the broker's close-ok). Messages not
// yet confirmed may still reach their queue. It returns an error if some
// goroutine did not end in time; a second Close returns amqp.ErrClosed.
func (p *Publisher) Close() error {
	first := false
	var err error
	p.closeOnce.Do(func() {
		first = true
		err = p.shutdown(time.Now().Add(p.o.CloseTimeout))
	})
	if !first {
		return amqp.ErrClosed
	}
	return err
}

// shutdown is the first Close, bounded by deadline in three steps: stop
// the manager, fail what is left and close the connection aside, then wait
// for the other goroutines.
func (p *Publisher) shutdown(deadline time.Time) error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	// The manager never blocks on the network, but it may be in a
	// DialFunc that does not honour its ctx.
	if !closedBy(p.done, deadline) {
		p.mu.Lock()
		p.failAllLocked()
		p.mu.Unlock()
		return fmt.Errorf("failover: Close: DialFunc did not return within CloseTimeout (%v); "+
			"it should honour its ctx", p.o.CloseTimeout)
	}
	p.closeConnAside(deadline)
	ended := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(ended)
	}()
	if !closedBy(ended, deadline.Add(50*time.Millisecond)) {
		return fmt.Errorf("failover: Close: the connection did not close within CloseTimeout (%v); "+
			"it is being closed in the background, bounded by its read mode's own close timeout",
			p.o.CloseTimeout)
	}
	return nil
}

// closeConnAside fails what is still queued or unconfirmed (failAllLocked),
// and closes the current connection in a goroutine of p.wg. CloseDeadline's
// deadline bounds the close handshake in upstream mode only: drainer and
// legacy modes wait for close-ok up to their own CloseTimeout (5 s by
// default) whatever the deadline. So it runs aside, and Close returns at its
// own deadline regardless. The manager has returned: nothing else sets
// p.conn.
func (p *Publisher) closeConnAside(deadline time.Time) {
	p.mu.Lock()
	conn := p.conn
	p.conn = nil
	p.failAllLocked()
	p.mu.Unlock()
	if conn == nil {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		closeConn(conn.conn, conn.drain, deadline)
	}()
}

// closedBy reports whether ch is closed by deadline.
func closedBy(ch <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// startConn starts what a new connection needs: its drain loop in legacy
// mode, and a close listener.
func (p *Publisher) startConn(conn *amqp.Connection) *connGen {
	cg := &connGen{conn: conn, drain: startDrainLoop(conn, &p.wg)}
	cg.lost = conn.NotifyClose(make(chan *amqp.Error, 1))
	p.mu.Lock()
	p.conn = cg
	p.mu.Unlock()
	return cg
}

// retireConn abandons cg's connection in the background: CloseDeadline
// with a deadline of now returns at once in every read mode, but it is not
// worth betting the failover on.
func (p *Publisher) retireConn(cg *connGen) {
	p.mu.Lock()
	if p.conn == cg {
		p.conn = nil
	}
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		d := closeConn(cg.conn, cg.drain, time.Now())
		p.n.emit(Event{Kind: EventAbandoned, Latency: d})
	}()
}

// openChannel opens a channel in confirm mode on cg and starts its
// listener and sender; a probe channel carries one message at a time until
// the broker acks one. It is bounded by within and by Close: either
// abandons the connection, which fails the RPC.
func (p *Publisher) openChannel(cg *connGen, probe probeKind, within time.Duration) (*chanGen, error) {
	timer := time.AfterFunc(within, func() { closeConn(cg.conn, cg.drain, time.Now()) })
	stop := context.AfterFunc(p.ctx, func() { closeConn(cg.conn, cg.drain, time.Now()) })
	release := cg.drain.hold()
	ch, err := cg.conn.Channel()
	if err == nil {
		if err = ch.Confirm(false); err != nil {
			_ = ch.Close()
		}
	}
	release()
	timer.Stop()
	stop()
	if err != nil {
		return nil, err
	}
	g := &chanGen{
		cg:       cg,
		ch:       ch,
		inflight: map[uint64]*message{},
		order:    list.New(),
		failed:   make(chan struct{}),
		probe:    probe,
	}
	// Room for every confirmation that can be outstanding (one per
	// message, since upstream expands multiple acks), so the listener
	// never holds up the connection's reader.
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, p.o.MaxOutstanding+64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.listen(g, confirms, closes)
	}()
	go func() {
		defer p.wg.Done()
		p.send(g)
	}()
	return g, nil
}

// listen settles g's messages from its confirmations until the channel
// closes.
func (p *Publisher) listen(g *chanGen, confirms <-chan amqp.Confirmation, closes <-chan *amqp.Error) {
	for {
		select {
		case c, ok := <-confirms:
			if !ok {
				p.channelClosed(g, closes)
				return
			}
			p.confirm(g, c)
		case <-p.ctx.Done():
			// Closed: nothing is left to settle. The library closes
			// confirms later, in some modes only after its own close
			// timeout, and never blocks on it (the buffer has room).
			return
		}
	}
}

// confirm settles the message that c acks, or requeues the one it nacks
// and, unless KeepChannelOnNack, fails g so that the manager reopens it.
func (p *Publisher) confirm(g *chanGen, c amqp.Confirmation) {
	p.mu.Lock()
	m := g.inflight[c.DeliveryTag]
	if m == nil { // the generation was retired, or a stray tag
		p.mu.Unlock()
		return
	}
	delete(g.inflight, c.DeliveryTag)
	g.order.Remove(m.oelem)
	if c.Ack {
		p.stats.Confirmed++
		// The broker confirms again: the next stall is a new one.
		p.stats.AbandonStreak = 0
		p.stats.ConfirmTimeoutNow = p.o.ConfirmTimeout
		p.settle(m, nil)
		// The storm is over: the rest may follow.
		probed := g.probe != noProbe
		g.probe = noProbe
		p.mu.Unlock()
		if probed {
			p.kick()
		}
		return
	}
	p.stats.Nacks++
	m.lastNack = true
	if g.probe == probeFree {
		// The nack answers for the channel, which the broker opened
		// during the election, not for the message.
		m.attempts--
	}
	id := m.msg.MessageId
	p.requeue(m, fmt.Errorf("basic.nack of delivery tag %d", c.DeliveryTag), true)
	if !p.o.KeepChannelOnNack {
		g.fail(errors.New("failover: the broker nacked a message"), true)
	}
	p.mu.Unlock()
	p.kick()
	p.n.emit(Event{Kind: EventNack, MessageID: id})
}

// channelClosed fails g once its confirmations ended: if the broker
// closed the channel, the manager replaces it (a closed connection is
// seen on its own listener).
func (p *Publisher) channelClosed(g *chanGen, closes <-chan *amqp.Error) {
	var err error = amqp.ErrClosed
	if e, ok := <-closes; ok && e != nil {
		err = e
	}
	p.mu.Lock()
	g.fail(fmt.Errorf("failover: channel closed: %w", err), false)
	p.mu.Unlock()
}

// send publishes queued messages on g until g is retired or fails.
func (p *Publisher) send(g *chanGen) {
	for {
		m := p.next(g)
		if m == nil {
			return
		}
		release := g.cg.drain.hold()
		err := g.ch.PublishWithContext(p.ctx, m.exchange, m.key, m.mandatory, false, m.msg)
		release()
		if err != nil {
			// The message stays in flight: retiring g requeues it.
			p.mu.Lock()
			g.fail(fmt.Errorf("failover: publish: %w", err), false)
			p.mu.Unlock()
			return
		}
		// More work is likely queued: do not wait for a wake-up.
	}
}

// next waits until g may publish a queued message, and returns it in
// flight on g; nil once g is retired or failed, or at Close.
func (p *Publisher) next(g *chanGen) *message {
	p.mu.Lock()
	for !g.dead && g.failErr == nil {
		if m := p.takeLocked(g); m != nil {
			p.inFlightLocked(g, m)
			p.mu.Unlock()
			return m
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-g.failed:
		case <-p.ctx.Done():
			return nil
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
	return nil
}

// takeLocked removes the first queued message for g to publish; nil when
// the queue is empty, or when g is a probe channel with a message still
// unconfirmed. That is the probe rule: a channel opened during a nack
// storm (see reopenDelay) may nack every publish for as long as it lives,
// so it carries one message at a time, and a reopen in the storm spends
// at most one attempt (MaxAttempts) of one message, not one of every
// queued message (probeFree spends none). confirm lifts the rule at the
// channel's first ack. Caller holds p.mu.
func (p *Publisher) takeLocked(g *chanGen) *message {
	e := p.queue.Front()
	if e == nil || (g.probe != noProbe && g.order.Len() > 0) {
		return nil
	}
	m := p.queue.Remove(e).(*message)
	m.qelem = nil
	return m
}

// inFlightLocked records m as in flight on g, under the delivery tag its
// publish will get. Only g's sender publishes on g.ch, so the tag is
// exact; it is recorded before the write so that the confirm, however
// fast, finds it. Caller holds p.mu.
func (p *Publisher) inFlightLocked(g *chanGen, m *message) {
	tag := g.ch.GetNextPublishSeqNo()
	m.gen = g
	m.tag = tag
	m.sentAt = time.Now()
	if !m.keepWaiting || m.waitConn != g.cg {
		m.waitingSince, m.waitConn = m.sentAt, g.cg
	}
	m.keepWaiting = false
	m.attempts++
	g.inflight[tag] = m
	m.oelem = g.order.PushBack(m)
	p.stats.Published++
	if m.attempts > 1 {
		p.stats.Republished++
	}
}

// retireLocked ends g: its unconfirmed messages go back to the front of
// the queue in publish order, and its tags are forgotten, so a late
// confirmation of g settles nothing. A silent probe channel's message
// (silent) is not charged the attempt, and keeps its confirm timeout's
// start. Caller holds p.mu.
func (p *Publisher) retireLocked(g *chanGen, cause error, silent bool) int {
	if g.dead {
		return 0
	}
	g.dead = true
	if g.failErr == nil {
		close(g.failed)
	}
	if p.cur == g {
		p.cur = nil
	}
	n := 0
	for e := g.order.Back(); e != nil; e = g.order.Back() {
		m := g.order.Remove(e).(*message)
		delete(g.inflight, m.tag)
		if silent {
			m.attempts--
			m.keepWaiting = true
		}
		p.requeue(m, cause, true)
		n++
	}
	return n
}

// retire is retireLocked for the manager, which does not hold p.mu: it
// reports the messages put back in the queue as one EventRepublish, and
// kicks the sender, as confirm does after it requeues a nacked message.
func (p *Publisher) retire(g *chanGen, cause error, silent bool) {
	p.mu.Lock()
	n := p.retireLocked(g, cause, silent)
	p.mu.Unlock()
	if n > 0 {
		p.n.emit(Event{Kind: EventRepublish, Count: n})
	}
	p.kick()
}

// closeChannel closes a retired channel on a connection still in use, in
// the background, waiting at most within for its close-ok. Why a bound: a
// broker may never answer the close of a channel whose publishes it left
// silent, and in legacy mode a read waiting for that close-ok holds the
// socket, so that every later RPC of the connection, the next channel.open
// too, would wait behind it (legacy's contract: a write waits for a read
// in progress). Past within, the close-ok is left to the library, which
// keeps the channel's id until the broker answers or the connection ends.
func (p *Publisher) closeChannel(g *chanGen, within time.Duration) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(p.ctx, within)
		defer cancel()
		release := g.cg.drain.hold()
		_ = g.ch.CloseWithContext(ctx)
		release()
	}()
}

// run is the manager: it watches the current connection and channel, and
// replaces them: by a new channel on the same connection when the
// connection is still up (reopen), else by a new connection (failOver,
// redial). It never blocks on the network itself, except in setup, which
// SetupTimeout and Close bound.
func (p *Publisher) run(cg *connGen, g *chanGen) {
	defer close(p.done)
	tick, stop := p.watchdog()
	defer stop()
	streak := reopenStreak{confirmed: ^uint64(0)}
	for {
		p.connected(g)
		end, ok := p.watch(cg, g, tick)
		if !ok {
			return // Close
		}
		p.retire(g, end.cause, end.silent)
		if end.reopen {
			var closed bool
			if g, closed, end.cause = p.reopen(cg, g, end, &streak); closed {
				return
			}
			if g != nil {
				continue
			}
		}
		p.failOver(cg, end.cause)
		if cg, g = p.redial(); g == nil {
			return // Close
		}
	}
}

// watchdog returns the ticks of the ConfirmTimeout watchdog (nil, which
// never ticks, when it is off) and what stops them.
func (p *Publisher) watchdog() (<-chan time.Time, func()) {
	if p.o.ConfirmTimeout <= 0 {
		return nil, func() {}
	}
	// From the shortest timeout in force, so that an abandonment comes
	// within an eighth of ConfirmTimeout (1 s at most) of being due,
	// backed off or not, and a silent probe is reopened within a quarter.
	period := min(max(p.silentAfter(), 5*time.Millisecond), time.Second)
	t := time.NewTicker(period)
	return t.C, t.Stop
}

// connected makes g the current channel, and says so.
func (p *Publisher) connected(g *chanGen) {
	p.mu.Lock()
	p.cur = g
	p.stats.Connects++
	p.mu.Unlock()
	p.n.emit(Event{Kind: EventConnected})
	p.kick()
}

// watchEnd is why watch stopped watching a channel.
type watchEnd struct {
	cause  error
	reopen bool // the connection is still up: a new channel on it replaces the old
	nacked bool // a nack retired the channel
	silent bool // a probe channel answered nothing (silentProbe)
}

// watch waits until something ends g: its connection's loss, its failure,
// the ConfirmTimeout watchdog abandoning its connection, or its probe's
// silence. It reports false at Close.
func (p *Publisher) watch(cg *connGen, g *chanGen, tick <-chan time.Time) (watchEnd, bool) {
	for {
		select {
		case <-p.ctx.Done():
			return watchEnd{}, false
		case e, ok := <-cg.lost:
			return watchEnd{cause: fmt.Errorf("failover: connection lost: %w", closeErr(e, ok))}, true
		case <-g.failed:
			p.mu.Lock()
			end := watchEnd{cause: g.failErr, reopen: g.nacked, nacked: g.nacked}
			p.mu.Unlock()
			if !end.reopen {
				// A write error, or the channel closed: if the connection
				// is gone too (its close may trail the channel's by a
				// moment), fail over; else reopen.
				end.reopen = !connEnds(cg, 20*time.Millisecond)
			}
			return end, true
		case now := <-tick:
			if cause := p.overdue(g, now); cause != nil {
				return watchEnd{cause: cause}, true
			}
			if cause := p.silentProbe(g, now); cause != nil {
				return watchEnd{cause: cause, reopen: true, silent: true}, true
			}
		}
	}
}

// overdue is the watchdog's check at now: when g's oldest unconfirmed
// message has waited the confirm timeout in force on this connection,
// silent reopens included, it counts the abandonment, backs the timeout
// off, and returns the cause; else nil.
func (p *Publisher) overdue(g *chanGen, now time.Time) error {
	p.mu.Lock()
	var oldest time.Time
	if e := g.order.Front(); e != nil {
		oldest = e.Value.(*message).waitingSince
	}
	timeout, streak := p.stats.ConfirmTimeoutNow, p.stats.AbandonStreak
	p.mu.Unlock()
	if oldest.IsZero() || now.Sub(oldest) < timeout {
		return nil
	}
	cause := fmt.Errorf("failover: no confirmation for %v (confirm timeout %v, %d abandonments before with no ack since): connection abandoned",
		now.Sub(oldest).Round(time.Millisecond), timeout, streak)
	p.mu.Lock()
	p.stats.Abandons++
	p.stats.AbandonStreak++
	p.stats.ConfirmTimeoutNow = p.backedOff(p.stats.AbandonStreak)
	next := p.stats.ConfirmTimeoutNow
	p.mu.Unlock()
	p.n.log.Warn("failover: confirm timeout, abandoning the connection", "waited", now.Sub(oldest),
		"timeout", timeout, "next_timeout", next)
	p.n.emit(Event{Kind: EventAbandon, Err: cause})
	return cause
}

// silentAfter is how long a probe channel's message may go unanswered
// before the channel is replaced on the same connection (silentProbe): an
// eighth of ConfirmTimeout, so that with the watchdog's period the reopen
// comes within a quarter of it.
func (p *Publisher) silentAfter() time.Duration { return p.o.ConfirmTimeout / 8 }

// silentProbe is the watchdog's other check at now. A probe channel (the
// first after a failover, or one opened in a nack storm) whose message has
// had no answer, neither ack nor nack, for silentAfter is replaced on the
// same connection, and the count and the cause returned; else nil.
//
// Why: such a channel can stay silent after the queue is ready again. A
// channel opened on a healthy node while its peers still counted a frozen
// node as the queue's leader confirms nothing after the election, where a
// fresh channel is confirmed at once (issue #43: 9.4 s of silence on the
// healthy node, until ConfirmTimeout abandoned it too). The new channel's
// channel.open tells the two silences apart: a node that answers it is
// alive and only its queue is not ready, so the connection is kept; one
// that does not answer within a quarter of ConfirmTimeout is gone, and the
// publisher fails over (reopen). The confirm timeout still counts from the
// message's first publish on the connection (waitingSince), so reopens
// that stay silent end in an abandonment, as a silent channel did before,
// but only at MaxConfirmTimeout (nodeAnswered): the node proved alive, and a
// silence that followed the publisher from a failed node to a live one is
// the queue's, which the next node would share. With the backed-off
// timeout instead, an election of about 9 s (the cluster suite's fault
// 8L) had node c, healthy, abandoned 6.5 s after the freeze, for node a.
func (p *Publisher) silentProbe(g *chanGen, now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := g.order.Front()
	if g.probe == noProbe || e == nil {
		return nil
	}
	waited := now.Sub(e.Value.(*message).sentAt)
	if waited < p.silentAfter() {
		return nil
	}
	p.stats.SilentReopens++
	return fmt.Errorf("failover: probe unanswered for %v", waited.Round(time.Millisecond))
}

// nodeAnswered raises the confirm timeout in force to MaxConfirmTimeout
// once a silent probe's replacement opened: the node answers RPCs, so its
// silence is its queue's, an election most likely, which moving on would
// not shorten (silentProbe). An ack resets it, as after abandonments.
func (p *Publisher) nodeAnswered() {
	p.mu.Lock()
	p.stats.ConfirmTimeoutNow = max(p.stats.ConfirmTimeoutNow, p.o.MaxConfirmTimeout)
	p.mu.Unlock()
}

// reopenStreak counts the channel reopens with no confirmation between
// them: a quorum queue's leader election still running (see reopenDelay).
type reopenStreak struct {
	n         int       // reopens since the last confirmation
	confirmed uint64    // p.stats.Confirmed at the last reopen
	start     time.Time // the first reopen since a confirmation: the storm's start
}

// count records a reopen, given the confirmations so far.
func (s *reopenStreak) count(confirmed uint64) {
	if confirmed == s.confirmed {
		s.n++ // nothing confirmed since the last reopen
	} else {
		s.n, s.start = 0, time.Now()
	}
	s.confirmed = confirmed
}

// reopen replaces g, retired, by a new channel on cg, after reopenDelay
// when it follows other reopens with no confirmation between them. A
// reopen that follows a nack in such a streak (a storm), or a silent
// probe, opens a probe channel: probeFree within MaxConfirmTimeout of the
// storm's start, probeCharged past it. A silent probe's reopen does not
// wait (the silence paced it), and its channel.open is bounded by a
// quarter of ConfirmTimeout: a node that does not answer it is gone. It
// reports closed when Close came during the wait, and the error of a
// channel that would not open, after which the connection is failed over.
func (p *Publisher) reopen(cg *connGen, g *chanGen, end watchEnd, s *reopenStreak) (ng *chanGen, closed bool, err error) {
	p.mu.Lock()
	p.stats.ChannelReopens++
	s.count(p.stats.Confirmed)
	p.mu.Unlock()
	p.n.log.Info("failover: reopening the channel", "cause", end.cause)
	p.n.emit(Event{Kind: EventChannelReopen, Err: end.cause})
	if !end.silent {
		p.closeChannel(g, p.o.CloseTimeout)
	}
	storm := s.n > 0 && end.nacked
	if s.n > 0 && !end.silent && !sleepCtx(p.ctx, p.reopenDelay(s.n, storm)) {
		return nil, true, nil
	}
	probe, within := noProbe, p.o.SetupTimeout
	if storm || end.silent {
		probe = probeCharged
		if time.Since(s.start) < p.o.MaxConfirmTimeout {
			probe = probeFree
		}
	}
	if end.silent {
		within = min(within, p.o.ConfirmTimeout/4)
	}
	ng, err = p.openChannel(cg, probe, within)
	if end.silent && err == nil {
		p.nodeAnswered()
	}
	if end.silent {
		// Closed after its replacement opened: in legacy mode, the wait
		// for a close-ok that may never come would hold up the open
		// (closeChannel).
		p.closeChannel(g, p.silentAfter())
	}
	return ng, false, err
}

// failOver counts and reports the end of cg, lost or abandoned for cause,
// and abandons its connection.
func (p *Publisher) failOver(cg *connGen, cause error) {
	p.mu.Lock()
	p.stats.Failovers++
	p.mu.Unlock()
	p.n.log.Warn("failover: failing over", "cause", cause)
	p.n.emit(Event{Kind: EventConnectionLost, Err: cause})
	p.retireConn(cg)
}

// redial dials until a connection with a confirm channel is up, and
// returns both; nil at Close.
func (p *Publisher) redial() (*connGen, *chanGen) {
	for {
		conn, err := dialLoop(p.ctx, p.o.Dial, p.o.Backoff, p.n)
		if err != nil {
			return nil, nil // Close
		}
		cg := p.startConn(conn)
		// A probe: after a failover the queue may not be ready yet, and a
		// channel that stays silent is then replaced (silentProbe).
		g, err := p.openChannel(cg, probeCharged, p.o.SetupTimeout)
		if err == nil {
			return cg, g
		}
		p.n.log.Warn("failover: channel setup failed", "err", err)
		p.n.emit(Event{Kind: EventConnectionLost, Err: err})
		p.retireConn(cg)
		if !sleepCtx(p.ctx, p.o.Backoff.Initial) {
			return nil, nil
		}
	}
}

// reopenDelay is the wait before the channel reopen that follows n
// reopens with no confirmation between them (a quorum queue's leader
// election still running): Backoff's delay, so that a channel the broker
// keeps closing is not reopened in a tight loop. In a nack storm (storm:
// the channel was retired by a nack) the delay is capped at a quarter of
// ConfirmTimeout and at 1 s, within Backoff's bounds: a channel
// opened during the election nacks every publish for as long as it lives,
// even after the election (TestRabbitMQNackStormAfterLeaderElection), so
// only the next reopen sees that it ended, and an uncapped backoff (5 s
// by default) would hold the publisher that long after the broker could
// confirm again. The storm's channels are probe channels, which carry one
// message at a time, so a reopen spends at most one attempt of one message
// (MaxAttempts), not one of every unconfirmed message; and none within
// MaxConfirmTimeout of the first reopen since a confirmation (the
// storm's start), since a nack then
// answers for the channel, opened during the election, not for the
// message (the cluster suite's fault 5pmL: nacks for 4.3 s, which at 2
// reopens a second spent MaxAttempts of the probe). Past it, the storm
// is the broker refusing the message (a full queue with overflow
// reject-publish, say), and MaxAttempts ends it with ErrNacked.
func (p *Publisher) reopenDelay(n int, storm bool) time.Duration {
	d := p.o.Backoff.delay(n)
	if !storm {
		return d
	}
	limit := time.Second
	if p.o.ConfirmTimeout > 0 {
		limit = min(limit, p.o.ConfirmTimeout/4)
	}
	limit = min(max(limit, p.o.Backoff.Initial), p.o.Backoff.Max)
	return min(d, limit)
}

// backedOff is the confirm timeout after streak consecutive abandonments:
// ConfirmTimeout doubled streak times, capped by MaxConfirmTimeout.
// Unlike Backoff's redial delays it has no jitter: it bounds a wait for
// the broker rather than pacing retries against it.
func (p *Publisher) backedOff(streak int) time.Duration {
	d := p.o.ConfirmTimeout
	for i := 0; i < streak && d < p.o.MaxConfirmTimeout; i++ {
		d *= 2
	}
	return min(d, p.o.MaxConfirmTimeout)
}

func closeErr(e *amqp.Error, ok bool) error {
	if ok && e != nil {
		return e
	}
	return amqp.ErrClosed
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// connEnds reports whether cg's connection is closed, or closes within
// wait.
func connEnds(cg *connGen, wait time.Duration) bool {
	if cg.conn.IsClosed() {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-cg.lost:
		return true
	case <-t.C:
		return cg.conn.IsClosed()
	}
}

// failAllLocked retires the current channel and fails every message
// still queued with the publisher's closed error. p.mu is held.
func (p *Publisher) failAllLocked() {
	if g := p.cur; g != nil {
		p.retireLocked(g, errClosed, false)
	}
	for e := p.queue.Front(); e != nil; e = p.queue.Front() {
		m := p.queue.Remove(e).(*message)
		m.qelem = nil
		p.settle(m, errClosed)
	}
}
