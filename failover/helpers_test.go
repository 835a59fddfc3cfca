package failover

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	amqp "github.com/rabbitmq/amqp091-go"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// modes are the read modes behaviour tests run in: plain legacy proves
// the package's own drain loop; legacy-autodrain, that it stays out of
// the way of the library's.
var modes = []compat.Mode{compat.Upstream, compat.Drainer, compat.Legacy, compat.LegacyAutoDrain}

func forModes(t *testing.T, f func(t *testing.T, mode compat.Mode)) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { f(t, mode) })
	}
}

// cycleDial dials urls in turn, one per call, in mode.
func cycleDial(mode compat.Mode, urls ...string) DialFunc {
	var n atomic.Int64
	return func(ctx context.Context) (*amqp.Connection, error) {
		u := urls[int(n.Add(1)-1)%len(urls)]
		return compat.Dial(u, mode)
	}
}

// eventLog records events with their times.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) first(k EventKind) (Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Kind == k {
			return e, true
		}
	}
	return Event{}, false
}

func (l *eventLog) count(k EventKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Kind == k {
			n++
		}
	}
	return n
}

// action is what the fake broker does with one complete publish.
type action int

const (
	ack action = iota
	nack
	silent
	ackMultiple // ack with multiple set: confirms every earlier tag too
)

// published is one complete publish as the fake broker saw it.
type published struct {
	chIndex int    // 0 for the first channel the session opened, 1 for the next...
	channel uint16 // the channel id
	tag     uint64 // its delivery tag on that channel
	body    string
}

// brokerScript is a minimal confirming broker for fakepeer: it answers
// channel.open, confirm.select, channel.close and connection.close, and
// hands every complete basic.publish to decide. heartbeat > 0 sends a
// heartbeat frame at that interval. onOpen runs after channel.open-ok of
// each channel, with a send function (say, a late ack of an old channel).
type brokerScript struct {
	decide    func(p published) action
	heartbeat time.Duration
	onOpen    func(chIndex int, send func(...[]byte) error)
	onClose   func(channel uint16, send func(...[]byte) error)
	// ignoreClose leaves connection.close unanswered, as a node cut off
	// from its peers may.
	ignoreClose bool
	// keepSilentChannels leaves channel.close unanswered on a channel
	// whose publishes it left silent, as RabbitMQ does while the queue
	// has no leader.
	keepSilentChannels bool
	// frozenFrom, if > 0, leaves channel.open unanswered from the
	// session's channel of that rank on, as a frozen node does.
	frozenFrom int
}

func (b brokerScript) run(s *fakepeer.Session) error {
	var wmu sync.Mutex
	ss := &scriptSession{b: b, chans: map[uint16]*chState{}, send: func(frames ...[]byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return s.Send(frames...)
	}}
	defer ss.heartbeats(s)()
	for {
		f, err := s.ReadFrame()
		if err != nil {
			// The client went away (abandoned, say): not a failure.
			return nil
		}
		done := false
		switch f.Type {
		case fakepeer.FrameHeader, fakepeer.FrameBody:
			err = ss.content(f)
		case fakepeer.FrameMethod:
			done, err = ss.method(f)
		}
		if done || err != nil {
			return nil
		}
	}
}

// scriptSession is one connection served by a brokerScript.
type scriptSession struct {
	b      brokerScript
	send   func(frames ...[]byte) error // safe for concurrent use
	chans  map[uint16]*chState
	opened int // channels opened so far
}

// chState is one open channel: its last delivery tag and the message
// being received.
type chState struct {
	index     int // the channel's rank among those the session opened
	tag       uint64
	remaining uint64
	inBody    bool
	body      []byte
	silenced  bool // a publish was left unanswered
}

// heartbeats sends the script's heartbeats until the returned stop is
// called or the session ends.
func (ss *scriptSession) heartbeats(s *fakepeer.Session) (stop func()) {
	if ss.b.heartbeat <= 0 {
		return func() {}
	}
	quit := make(chan struct{})
	var hb sync.WaitGroup
	hb.Add(1)
	go func() {
		defer hb.Done()
		t := time.NewTicker(ss.b.heartbeat)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-s.Done():
				return
			case <-t.C:
				if ss.send(fakepeer.HeartbeatFrame()) != nil {
					return
				}
			}
		}
	}()
	return func() { close(quit); hb.Wait() }
}

// content takes a content header or body frame, and answers the message
// once its body is complete.
func (ss *scriptSession) content(f fakepeer.Frame) error {
	st := ss.chans[f.Channel]
	switch {
	case st == nil:
		return nil
	case f.Type == fakepeer.FrameHeader:
		st.remaining, st.body, st.inBody = binary.BigEndian.Uint64(f.Payload[4:12]), nil, true
	case !st.inBody:
		return nil
	default:
		st.body = append(st.body, f.Payload...)
		st.remaining -= uint64(len(f.Payload))
	}
	if st.remaining != 0 {
		return nil
	}
	st.inBody = false
	return ss.complete(f.Channel, st)
}

// complete answers the message just received on channel id as the script
// decides.
func (ss *scriptSession) complete(id uint16, st *chState) error {
	st.tag++
	switch ss.b.decide(published{chIndex: st.index, channel: id, tag: st.tag, body: string(st.body)}) {
	case ack:
		return ss.send(fakepeer.BasicAck(id, st.tag, false))
	case nack:
		return ss.send(fakepeer.BasicNack(id, st.tag, false, false))
	case ackMultiple:
		return ss.send(fakepeer.BasicAck(id, st.tag, true))
	}
	st.silenced = true
	return nil
}

// method answers a method frame; done reports connection.close answered.
func (ss *scriptSession) method(f fakepeer.Frame) (done bool, err error) {
	switch c, m := f.Method(); {
	case c == 20 && m == 10 && ss.b.frozenFrom > 0 && ss.opened >= ss.b.frozenFrom:
	case c == 20 && m == 10: // channel.open
		ss.chans[f.Channel] = &chState{index: ss.opened}
		ss.opened++
		err = ss.send(fakepeer.ChannelOpenOk(f.Channel))
		if err == nil && ss.b.onOpen != nil {
			ss.b.onOpen(ss.opened-1, ss.send)
		}
	case c == 85 && m == 10: // confirm.select
		err = ss.send(fakepeer.ConfirmSelectOk(f.Channel))
	case c == 20 && m == 40 && ss.b.keepSilentChannels && ss.chans[f.Channel] != nil && ss.chans[f.Channel].silenced:
		// channel.close of a silenced channel: no close-ok
	case c == 20 && m == 40: // channel.close
		if ss.b.onClose != nil {
			ss.b.onClose(f.Channel, ss.send)
		}
		delete(ss.chans, f.Channel)
		err = ss.send(fakepeer.ChannelCloseOk(f.Channel))
	case c == 10 && m == 50 && ss.b.ignoreClose:
	case c == 10 && m == 50: // connection.close
		_ = ss.send(fakepeer.ConnectionCloseOk())
		return true, nil
	}
	return false, err
}

// publishAll publishes n messages from workers goroutines and returns the
// errors, indexed by message.
func publishAll(ctx context.Context, p *Publisher, n, workers int, msg func(i int) (string, amqp.Publishing)) []error {
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				key, m := msg(i)
				errs[i] = p.Publish(ctx, "", key, false, m)
			}
		}()
	}
	wg.Wait()
	return errs
}

func firstErr(errs []error) error {
	n := 0
	var first error
	for _, e := range errs {
		if e != nil {
			n++
			if first == nil {
				first = e
			}
		}
	}
	if first != nil {
		return fmt.Errorf("%d of %d failed, first: %w", n, len(errs), first)
	}
	return nil
}

// durableQueue declares a uniquely named durable queue on the test broker,
// directly (not through a proxy), deleted when the test ends. Durable,
// because RabbitMQ 4.3 refuses transient non-exclusive queues and an
// exclusive one cannot be used from the failover connections.
func durableQueue(t *testing.T) (string, *amqp.Channel) {
	t.Helper()
	conn := testenv.Dial(t, amqp.Config{})
	ch := testenv.Channel(t, conn)
	name := fmt.Sprintf("failover-test-%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(name, false, false, false); err != nil && !errors.Is(err, amqp.ErrClosed) {
			t.Logf("delete %s: %v", name, err)
		}
	})
	return name, ch
}

// drainQueue gets every message of queue and returns the count of each
// MessageId.
func drainQueue(t *testing.T, ch *amqp.Channel, queue string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if !ok {
			return got
		}
		got[d.MessageId]++
	}
}
