package listenerorder

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// Tests here script the broker with the fake peer: RabbitMQ cannot be made
// to send channel.flow, nor connection.blocked on cue.

// notification is one frame the peer sends, and what the listener that
// receives it records: "flow#0:false", "return:7", "ack:3",
// "blocked#0:true" (flows and blocks are numbered in the order their
// listener received them).
type notification struct {
	channel bool // on the channel, as opposed to channel 0
	name    string
	frame   func(ch uint16, frameMax uint32) []byte
}

// script is a random interleaving of acks (for tags 1..acks, in order),
// returns, flows (alternating) and blocked/unblocked (alternating).
func script(rng *rand.Rand, acks, returns, flows, blocks int) []notification {
	var kinds []byte
	for _, k := range []struct {
		kind byte
		n    int
	}{{'a', acks}, {'r', returns}, {'f', flows}, {'b', blocks}} {
		kinds = append(kinds, bytes.Repeat([]byte{k.kind}, k.n)...)
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	var (
		out              []notification
		ack, ret, fl, bl int
	)
	for _, k := range kinds {
		switch k {
		case 'a':
			ack++
			tag := uint64(ack)
			out = append(out, notification{true, fmt.Sprint("ack:", tag), func(ch uint16, _ uint32) []byte { return fakepeer.BasicAck(ch, tag, false) }})
		case 'r':
			id := strconv.Itoa(ret)
			ret++
			out = append(out, notification{true, "return:" + id, func(ch uint16, frameMax uint32) []byte {
				return fakepeer.BasicReturn(ch, 312, "NO_ROUTE", "", "nowhere", []byte(id), frameMax)
			}})
		case 'f':
			active := fl%2 == 1
			out = append(out, notification{true, fmt.Sprintf("flow#%d:%v", fl, active), func(ch uint16, _ uint32) []byte { return fakepeer.ChannelFlow(ch, active) }})
			fl++
		case 'b':
			active := bl%2 == 0
			out = append(out, notification{false, fmt.Sprintf("blocked#%d:%v", bl, active), func(uint16, uint32) []byte {
				if active {
					return fakepeer.ConnectionBlocked("low memory")
				}
				return fakepeer.ConnectionUnblocked()
			}})
			bl++
		}
	}
	return out
}

// readUntilDeclare reads and discards what the client sends up to its
// queue.declare, which says its listeners are registered.
func readUntilDeclare(s *fakepeer.Session, ch uint16) error {
	for {
		f, err := s.ReadFrame()
		if err != nil {
			return err
		}
		if c, m := f.Method(); f.Type == fakepeer.FrameMethod && f.Channel == ch && c == 50 && m == 10 {
			return nil
		}
	}
}

// send writes the notifications in several writes, so that the client
// reads them in several reads too.
func send(s *fakepeer.Session, ch uint16, ns []notification) error {
	var buf []byte
	for i, n := range ns {
		buf = append(buf, n.frame(ch, s.FrameMax())...)
		if len(buf) > 4096 || i == len(ns)-1 {
			if err := s.Send(buf); err != nil {
				return err
			}
			buf = nil
		}
	}
	return nil
}

// compare reports how the received sequence departs from the sent one:
// overtaken counts the notifications received after one that was sent
// later than them (each such one was handed to its listener late), and
// first describes the first of them. A notification missing, duplicated
// or unknown is reported in first too, and counted.
func compare(sent, got []string) (overtaken int, first string) {
	index := make(map[string]int, len(sent))
	for i, s := range sent {
		index[s] = i
	}
	note := func(format string, args ...any) {
		if overtaken == 0 {
			first = fmt.Sprintf(format, args...)
		}
		overtaken++
	}
	seen := make(map[string]bool, len(got))
	latest := -1 // the highest sent index received so far
	for i, g := range got {
		j, ok := index[g]
		switch {
		case !ok:
			note("received %q (position %d), which was never sent", g, i)
		case seen[g]:
			note("received %q twice", g)
		case j < latest:
			note("received %q (sent %d) after %q (sent %d)", g, j, sent[latest], latest)
		default:
			latest = j
		}
		seen[g] = true
	}
	for _, s := range sent {
		if !seen[s] {
			note("never received %q", s)
		}
	}
	return overtaken, first
}

// TestChannelOrderFakePeer: the peer sends a random interleaving of
// channel.flow, basic.return and basic.ack on one channel, and
// connection.blocked/unblocked, to unbuffered listeners that one select
// loop reads. The channel's notifications must be received in the order of
// their frames, across its three listeners, and the blocked ones in theirs.
func TestChannelOrderFakePeer(t *testing.T) {
	each := size(t, 200, 1000, 5000)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { channelOrderFakePeer(t, mode, each) })
	}
}

func channelOrderFakePeer(t *testing.T, mode compat.Mode, each int) {
	verifyNoLeaks(t)
	seed := uint64(time.Now().UnixNano())
	ns := script(rand.New(rand.NewPCG(seed, 5)), each, each, each/2, each/2)
	var sentCh, sentBlocked []string
	for _, n := range ns {
		if n.channel {
			sentCh = append(sentCh, n.name)
		} else {
			sentBlocked = append(sentBlocked, n.name)
		}
	}

	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		if _, err := s.ExpectMethod(ch, 85, 10); err != nil { // confirm.select
			return err
		}
		if err := s.Send(fakepeer.ConfirmSelectOk(ch)); err != nil {
			return err
		}
		if err := readUntilDeclare(s, ch); err != nil {
			return err
		}
		if err := send(s, ch, ns); err != nil {
			return err
		}
		return s.Send(fakepeer.QueueDeclareOk(ch, "ready", 0, 0))
	})

	conn := dial(t, peer.URL(), mode)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	flows := ch.NotifyFlow(make(chan bool))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking))
	ctx, cancel := context.WithTimeout(context.Background(), runBound)
	defer cancel()
	for i := 0; i < each; i++ { // the acks' delivery tags
		if err := ch.PublishWithContext(ctx, "", "q", false, false, amqp.Publishing{}); err != nil {
			t.Fatal(err)
		}
	}

	type record struct{ ch, blocked []string }
	recorded := make(chan record, 1)
	go func() {
		var (
			r      record
			nflows int
		)
		for len(r.ch)+len(r.blocked) < len(ns) {
			select {
			case active := <-flows:
				r.ch = append(r.ch, fmt.Sprintf("flow#%d:%v", nflows, active))
				nflows++
			case ret := <-returns:
				r.ch = append(r.ch, "return:"+string(ret.Body))
			case c := <-confirms:
				r.ch = append(r.ch, fmt.Sprint("ack:", c.DeliveryTag))
			case b := <-blocks:
				r.blocked = append(r.blocked, fmt.Sprintf("blocked#%d:%v", len(r.blocked), b.Active))
			case <-ctx.Done():
				recorded <- r
				return
			}
		}
		recorded <- r
	}()
	// The RPC the peer answers after the notifications. In legacy mode
	// it reads, and dispatches, every frame before its reply.
	start := time.Now()
	if _, err := ch.QueueDeclare("ready", false, false, true, false, nil); err != nil {
		t.Fatalf("the declare after the notifications: %v", err)
	}
	stop := pump(t, conn, mode) // nothing left to read; harmless
	r := <-recorded
	stop()
	took := time.Since(start)
	if len(r.ch)+len(r.blocked) < len(ns) {
		t.Fatalf("%v: received %d of %d notifications within %v", mode, len(r.ch)+len(r.blocked), len(ns), runBound)
	}
	chDiff, chFirst := compare(sentCh, r.ch)
	blDiff, blFirst := compare(sentBlocked, r.blocked)
	t.Logf("%v: %d channel notifications (ack, return, flow) and %d blocked in %s; received after one sent later: %d channel, %d blocked (seed %d)",
		mode, len(sentCh), len(sentBlocked), took.Round(time.Millisecond), chDiff, blDiff, seed)
	if chDiff > 0 {
		t.Errorf("%v: %d of %d notifications of the channel reached their listeners after one sent later (out of frame order across listeners); first: %s",
			mode, chDiff, len(sentCh), chFirst)
	}
	if blDiff > 0 {
		t.Errorf("%v: %d of %d blocked notifications out of frame order; first: %s", mode, blDiff, len(sentBlocked), blFirst)
	}
}

// TestConnectionCloseAfterNotificationsFakePeer: the peer sends returns on
// a channel and connection.blocked/unblocked, then connection.close. One
// select loop reads unbuffered NotifyReturn and NotifyBlocked listeners
// and the connection's and the channel's NotifyClose (buffered to 1) until
// all are closed: every return and blocked notification must be received
// before either close error.
func TestConnectionCloseAfterNotificationsFakePeer(t *testing.T) {
	rounds := size(t, 10, 50, 200)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			var violations examples
			start := time.Now()
			for r := 0; r < rounds; r++ {
				if v := connectionCloseAfterNotifications(t, mode, 50); v != "" {
					violations.add("round %d: %s", r, v)
				}
			}
			t.Logf("%v: %d connection closes behind 50 returns and 2 blocked notifications in %s; violations: %d",
				mode, rounds, time.Since(start).Round(time.Millisecond), violations.n)
			if violations.n > 0 {
				t.Errorf("%v: %d of %d connection closes overtook notifications that came before them; violations: %v",
					mode, violations.n, rounds, &violations)
			}
		})
	}
}

func connectionCloseAfterNotifications(t *testing.T, mode compat.Mode, n int) (violation string) {
	peer := fakepeer.Listen(t)
	peer.Serve(func(s *fakepeer.Session) error {
		ch, err := s.AnswerChannelOpen()
		if err != nil {
			return err
		}
		if err := readUntilDeclare(s, ch); err != nil {
			return err
		}
		if err := s.Send(fakepeer.QueueDeclareOk(ch, "ready", 0, 0)); err != nil {
			return err
		}
		// The client publishes once its listeners are read; the
		// notifications and the close go out after that, not beside the
		// declare's reply, which the close would overtake.
		for {
			f, err := s.ReadFrame()
			if err != nil {
				return err
			}
			if c, m := f.Method(); f.Type == fakepeer.FrameMethod && f.Channel == ch && c == 60 && m == 40 {
				break
			}
		}
		var buf []byte
		for i := 0; i < n; i++ {
			buf = append(buf, fakepeer.BasicReturn(ch, 312, "NO_ROUTE", "", "nowhere", []byte(strconv.Itoa(i)), s.FrameMax())...)
			if i == n/2 {
				buf = append(buf, fakepeer.ConnectionBlocked("low memory")...)
			}
		}
		buf = append(buf, fakepeer.ConnectionUnblocked()...)
		buf = append(buf, fakepeer.ConnectionClose(320, "CONNECTION_FORCED - listenerorder", 0, 0)...)
		return s.Send(buf)
	})
	conn := dial(t, peer.URL(), mode)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking))
	connCloses := conn.NotifyClose(make(chan *amqp.Error, 1))
	chCloses := ch.NotifyClose(make(chan *amqp.Error, 1))
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()

	var order []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for returns != nil || blocks != nil || connCloses != nil || chCloses != nil {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				order = append(order, "return:"+string(r.Body))
			case b, ok := <-blocks:
				if !ok {
					blocks = nil
					continue
				}
				order = append(order, fmt.Sprint("blocked:", b.Active))
			case err, ok := <-connCloses:
				if !ok {
					connCloses = nil
					continue
				}
				order = append(order, fmt.Sprint("connection close:", err.Code))
			case err, ok := <-chCloses:
				if !ok {
					chCloses = nil
					continue
				}
				order = append(order, fmt.Sprint("channel close:", err.Code))
			case <-ctx.Done():
				order = append(order, "timeout")
				return
			}
		}
	}()
	if _, err := ch.QueueDeclare("ready", false, false, true, false, nil); err != nil {
		t.Fatalf("the declare before the notifications: %v", err)
	}
	// The go signal; the pump starts after it, since a legacy publish
	// would wait for a blocked reader.
	if err := ch.PublishWithContext(ctx, "", "go", false, false, amqp.Publishing{}); err != nil {
		t.Fatalf("the publish before the notifications: %v", err)
	}
	stop := pump(t, conn, mode)
	<-done
	stop()

	notified, closes := 0, 0
	for i, o := range order {
		switch {
		case o == "timeout":
			t.Fatalf("%v: the listeners were not all closed within %v; received: %q", mode, bound, order)
		case len(o) > 6 && (o[:6] == "return" || o[:7] == "blocked"):
			if closes > 0 {
				return fmt.Sprintf("%q received after a close error (position %d of %q)", o, i, order)
			}
			notified++
		default:
			closes++
		}
	}
	if notified != n+2 || closes != 2 {
		return fmt.Sprintf("received %d of %d notifications and %d of 2 close errors: %q", notified, n+2, closes, order)
	}
	return ""
}

// TestRPCReplyBeforeConnectionCloseFakePeer: the peer sends an RPC's reply
// and connection.close in one write. The reply came first, so the caller
// gets it, as upstream's reader hands it over before it reads the close;
// the close only reaches NotifyClose.
func TestRPCReplyBeforeConnectionCloseFakePeer(t *testing.T) {
	rounds := size(t, 10, 50, 200)
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			verifyNoLeaks(t)
			var violations examples
			for r := 0; r < rounds; r++ {
				peer := fakepeer.Listen(t)
				peer.Serve(func(s *fakepeer.Session) error {
					ch, err := s.AnswerChannelOpen()
					if err != nil {
						return err
					}
					if err := readUntilDeclare(s, ch); err != nil {
						return err
					}
					return s.Send(fakepeer.QueueDeclareOk(ch, "ready", 0, 0),
						fakepeer.ConnectionClose(320, "CONNECTION_FORCED - listenerorder", 0, 0))
				})
				conn := dial(t, peer.URL(), mode)
				ch, err := conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := ch.QueueDeclare("ready", false, false, true, false, nil); err != nil {
					violations.add("round %d: the declare whose reply preceded connection.close returned %v", r, err)
				}
			}
			t.Logf("%v: %d RPC replies followed at once by connection.close; callers that got the close instead: %d", mode, rounds, violations.n)
			if violations.n > 0 {
				t.Errorf("%v: %d of %d RPCs got the connection's close although their reply came before it; violations: %v",
					mode, violations.n, rounds, &violations)
			}
		})
	}
}
