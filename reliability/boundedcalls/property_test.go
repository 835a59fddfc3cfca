package boundedcalls

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
)

// The property: random sequences of calls with random deadlines, on
// several channels of one connection at once, against a peer that
// answers each request after a random delay or never. Every call returns
// by its deadline plus grace; a call that succeeds gets its own reply;
// an abandoned channel is closed and replaced; the connection survives;
// Close returns and no goroutine is left.
//
// The client tells the peer how to answer in the queue name it sends:
// "q-<id>-<delay ms>" or "q-<id>-never", with "-empty" for a basic.get
// answered by get-empty. The peer echoes the id, so a reply that reached
// the wrong call shows: queue.declare-ok names the queue and counts id
// messages and worker consumers, queue.purge-ok and queue.delete-ok count
// id messages, basic.get-ok routes the message with the queue name as key
// and body and counts id messages. Channel opens and closes carry no
// name: the peer answers them after a random delay of its own, always.

const (
	propWorkers  = 4                     // channels in use at once
	propMaxDelay = 60 * time.Millisecond // the peer's longest delay
)

// propConfig sizes one run.
type propConfig struct {
	seed  int64
	steps int // calls per worker
}

// propResult counts what a run did.
type propResult struct {
	mu                                  sync.Mutex
	calls, succeeded, abandoned         int
	notSent                             int // deadline passed before the call began: nothing sent, channel kept
	unbounded                           int // calls without a deadline (all must succeed)
	opens, opensAbandoned               int
	closes, closesAbandoned             int
	replaced                            int // channels replaced after an abandoned call
	maxOverrun                          time.Duration
	lateReplies, neverAnswered, reopens int // the peer's side
	violations                          examples
}

func (r *propResult) add(f func(r *propResult)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

func (r *propResult) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%d calls (%d without deadline): %d succeeded, %d abandoned, %d not sent; %d channel opens (%d abandoned, %d ids reused), "+
		"%d closes (%d abandoned), %d channels replaced; peer: %d requests never answered, %d replies sent after the client's channel.close; max overrun %v",
		r.calls, r.unbounded, r.succeeded, r.abandoned, r.notSent, r.opens, r.opensAbandoned, r.reopens, r.closes, r.closesAbandoned, r.replaced,
		r.neverAnswered, r.lateReplies, r.maxOverrun.Round(100*time.Microsecond))
}

// examples keeps the first few violations for a failure message.
type examples struct {
	n    int
	list []string
}

func (e *examples) add(format string, args ...any) {
	e.n++
	if len(e.list) < 8 {
		e.list = append(e.list, fmt.Sprintf(format, args...))
	}
}

func (e *examples) String() string {
	if e.n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d, first: %s", e.n, strings.Join(e.list, "; "))
}

// propSeeds are the seeds of the default run.
var propSeeds = []int64{1, 2, 3, 20240601, 7777}

// TestBoundedCallsProperty runs the property for fixed seeds, in every
// mode.
func TestBoundedCallsProperty(t *testing.T) {
	seeds := propSeeds[:size(t, 1, 3, len(propSeeds))]
	steps := size(t, 25, 40, 200)
	totals := map[string]*propResult{}
	t.Cleanup(func() {
		var b strings.Builder
		for _, m := range modes {
			if r := totals[m.String()]; r != nil {
				fmt.Fprintf(&b, "\n  %-16s %v", m, r)
			}
		}
		t.Logf("property, seeds %v, %d workers x %d calls:%s", seeds, propWorkers, steps, b.String())
	})
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			total := &propResult{}
			totals[mode.String()] = total
			for _, seed := range seeds {
				t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
					r := runProperty(t, mode, propConfig{seed: seed, steps: steps})
					total.merge(r)
				})
			}
		})
	}
}

// FuzzBoundedCalls runs the property, shorter, for a fuzzed seed in
// every mode.
func FuzzBoundedCalls(f *testing.F) {
	f.Add(int64(11))
	f.Add(int64(12))
	f.Fuzz(func(t *testing.T, seed int64) {
		for _, mode := range modes {
			t.Run(mode.String(), func(t *testing.T) {
				runProperty(t, mode, propConfig{seed: seed, steps: 12})
			})
		}
	})
}

func (r *propResult) merge(o *propResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	r.add(func(r *propResult) {
		r.calls += o.calls
		r.succeeded += o.succeeded
		r.abandoned += o.abandoned
		r.unbounded += o.unbounded
		r.opens += o.opens
		r.opensAbandoned += o.opensAbandoned
		r.closes += o.closes
		r.closesAbandoned += o.closesAbandoned
		r.replaced += o.replaced
		r.lateReplies += o.lateReplies
		r.neverAnswered += o.neverAnswered
		r.reopens += o.reopens
		r.maxOverrun = max(r.maxOverrun, o.maxOverrun)
	})
}

func runProperty(t *testing.T, mode compat.Mode, cfg propConfig) *propResult {
	verifyNoLeaks(t)
	res := &propResult{}
	peerRng := rand.New(rand.NewPCG(uint64(cfg.seed), 0xfeed))
	evs := newEvents()
	// A channel-max a little above the channels in use makes the
	// allocator wrap, so that ids of abandoned channels are reused.
	peer := fakepeer.Listen(t, fakepeer.WithIOTimeout(ioTimeout), fakepeer.WithChannelMax(8*propWorkers))
	peer.Serve(evs.script(func(s *fakepeer.Session) error { return propertyPeer(s, peerRng, res) }))
	conn := dial(t, peer, mode)
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))

	var wg sync.WaitGroup
	for w := 1; w <= propWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(conn, w, rand.New(rand.NewPCG(uint64(cfg.seed), uint64(w))), cfg.steps, res)
		}()
	}
	wg.Wait()

	select {
	case e := <-connClosed:
		res.add(func(r *propResult) { r.violations.add("the connection closed during the run: %v", e) })
	default:
	}
	closed := make(chan error, 1)
	go func() { closed <- conn.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			res.add(func(r *propResult) { r.violations.add("Close: %v", err) })
		}
	case <-time.After(bound):
		t.Fatalf("%v seed %d: Close did not return within %v%s", mode, cfg.seed, bound, clientGoroutines())
	}
	select {
	case ev := <-evs:
		if ev.what == "error" {
			res.add(func(r *propResult) { r.violations.add("the peer: %v", ev.err) })
		}
	default:
	}
	t.Logf("%v seed %d: %v", mode, cfg.seed, res)
	if res.violations.n > 0 {
		t.Errorf("%v seed %d: violations: %v", mode, cfg.seed, &res.violations)
	}
	return res
}

// callKind is one of the RPCs whose reply echoes the request.
type callKind int

const (
	kindDeclare callKind = iota
	kindPurge
	kindDelete
	kindGet
	kindGetEmpty
	numKinds
)

var kindNames = [...]string{"queue.declare", "queue.purge", "queue.delete", "basic.get", "basic.get(empty)"}

// worker runs steps calls on channels of its own, replacing each channel
// that an abandoned call closed.
func worker(conn *amqp.Connection, w int, rng *rand.Rand, steps int, res *propResult) {
	var ch *amqp.Channel
	violation := func(format string, args ...any) {
		res.add(func(r *propResult) { r.violations.add("worker %d: "+format, append([]any{w}, args...)...) })
	}
	// randomDeadline returns a context with a deadline of 1–50 ms, or
	// none (context.Background) with probability noneIn100/100.
	randomDeadline := func(noneIn100 int) (context.Context, context.CancelFunc, time.Duration) {
		if rng.IntN(100) < noneIn100 {
			return context.Background(), func() {}, 0
		}
		d := time.Duration(1+rng.IntN(50)) * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), d)
		return ctx, cancel, d
	}
	// timed runs call and checks that it returned in time: by its
	// deadline plus grace, or, without a deadline, by the peer's longest
	// delay plus grace.
	timed := func(what string, d time.Duration, call func() error) error {
		start := time.Now()
		err := call()
		took := time.Since(start)
		limit := d
		if d == 0 {
			limit = propMaxDelay
		}
		over := took - limit
		res.add(func(r *propResult) { r.maxOverrun = max(r.maxOverrun, over) })
		if over > grace {
			violation("%s with deadline %v took %v", what, d, took)
		}
		return err
	}
	// abandoned checks the error of a call whose deadline passed.
	notSent := func(d time.Duration, err error) bool {
		var re *amqp.RPCError
		return d > 0 && errors.As(err, &re) && !re.Closed && errors.Is(err, context.DeadlineExceeded)
	}
	abandoned := func(what string, d time.Duration, err error) bool {
		var re *amqp.RPCError
		switch {
		case d > 0 && errors.Is(err, context.DeadlineExceeded) && errors.As(err, &re):
			return true
		case d == 0:
			violation("%s without deadline failed: %v", what, err)
		default:
			violation("%s with deadline %v: error %q (%T), want an *RPCError matching context.DeadlineExceeded", what, d, err, err)
		}
		return false
	}

	for step := 0; step < steps; step++ {
		if ch == nil {
			ctx, cancel, d := randomDeadline(30)
			var err error
			err = timed("channel.open", d, func() error { ch, err = conn.ChannelWithContext(ctx); return err })
			cancel()
			res.add(func(r *propResult) { r.opens++ })
			if err != nil {
				ch = nil
				if errors.Is(err, amqp.ErrChannelMax) {
					violation("channel.open: %v (ids of abandoned channels are not released)", err)
					return
				}
				if abandoned("channel.open", d, err) {
					res.add(func(r *propResult) { r.opensAbandoned++ })
				}
				continue
			}
		}
		if rng.IntN(100) < 5 { // close the channel and take another
			ctx, cancel, d := randomDeadline(50)
			err := timed("channel.close", d, func() error { return ch.CloseWithContext(ctx) })
			cancel()
			res.add(func(r *propResult) { r.closes++ })
			if err != nil && abandoned("channel.close", d, err) {
				res.add(func(r *propResult) { r.closesAbandoned++ })
			}
			ch = nil
			continue
		}

		id := uint32(w*100000 + step)
		kind := callKind(rng.IntN(int(numKinds)))
		ctx, cancel, d := randomDeadline(20)
		delay := "never"
		if d == 0 || rng.IntN(100) >= 15 {
			delay = strconv.Itoa(rng.IntN(int(propMaxDelay/time.Millisecond) + 1))
		}
		name := fmt.Sprintf("q-%d-%s", id, delay)
		if kind == kindGetEmpty {
			name += "-empty"
		}
		what := fmt.Sprintf("%s %q", kindNames[kind], name)
		var mismatch string
		err := timed(what, d, func() error {
			switch kind {
			case kindDeclare:
				q, err := ch.QueueDeclareWithContext(ctx, name, false, false, false, false, nil)
				if err == nil && (q.Name != name || q.Messages != int(id) || q.Consumers != w) {
					mismatch = fmt.Sprintf("got %+v", q)
				}
				return err
			case kindPurge:
				n, err := ch.QueuePurgeWithContext(ctx, name, false)
				if err == nil && n != int(id) {
					mismatch = fmt.Sprintf("got a purge-ok counting %d", n)
				}
				return err
			case kindDelete:
				n, err := ch.QueueDeleteWithContext(ctx, name, false, false, false)
				if err == nil && n != int(id) {
					mismatch = fmt.Sprintf("got a delete-ok counting %d", n)
				}
				return err
			default:
				m, ok, err := ch.GetWithContext(ctx, name, false)
				if err == nil {
					switch empty := kind == kindGetEmpty; {
					case ok == empty:
						mismatch = fmt.Sprintf("got ok=%v", ok)
					case ok && (m.RoutingKey != name || string(m.Body) != name || m.MessageCount != id):
						mismatch = fmt.Sprintf("got the message %q routed by %q counting %d", m.Body, m.RoutingKey, m.MessageCount)
					}
				}
				return err
			}
		})
		cancel()
		res.add(func(r *propResult) {
			r.calls++
			if d == 0 {
				r.unbounded++
			}
		})
		switch {
		case err == nil && mismatch != "":
			violation("%s: another call's reply: %s", what, mismatch)
		case err == nil:
			res.add(func(r *propResult) { r.succeeded++ })
		case notSent(d, err):
			// The deadline passed before the call began (a loaded
			// machine, a 1 ms deadline): nothing was sent, so nothing is
			// abandoned and the channel goes on, as documented.
			res.add(func(r *propResult) { r.notSent++ })
			if ch.IsClosed() {
				violation("%s: not sent (%v), yet the channel is closed", what, err)
			}
		case abandoned(what, d, err):
			res.add(func(r *propResult) { r.abandoned++; r.replaced++ })
			if !errors.Is(err, amqp.ErrClosed) {
				violation("%s: the error %q does not say the channel was closed", what, err)
			}
			if !ch.IsClosed() {
				violation("%s: the channel is still open after the abandoned call", what)
			}
			ch = nil
		default:
			ch = nil // reported; go on with another channel
		}
	}
	if ch != nil {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		if err := ch.CloseWithContext(ctx); err != nil {
			violation("the last channel's Close: %v", err)
		}
		cancel()
	}
}

// propertyPeer answers the requests of the property's workers as the
// names they carry say, each after its delay; per channel, replies go out
// in the order of the requests, and channel.close-ok after every reply
// still pending on the channel, as a broker's would.
func propertyPeer(s *fakepeer.Session, rng *rand.Rand, res *propResult) error {
	frames, readErr := s.Incoming()
	type out struct {
		at  time.Time
		seq int
		ch  uint16
		b   []byte
		ok  bool // channel.close-ok
	}
	var (
		queue   []out
		seq     int
		lastAt  = map[uint16]time.Time{}
		state   = map[uint16]string{} // "open", "closing" (close-ok pending) or "" (closed)
		everOne = map[uint16]bool{}
		timer   = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	schedule := func(ch uint16, d time.Duration, b []byte, closeOk bool) {
		at := time.Now().Add(d)
		if l := lastAt[ch]; at.Before(l) {
			at = l
		}
		lastAt[ch] = at
		seq++
		queue = append(queue, out{at: at, seq: seq, ch: ch, b: b, ok: closeOk})
		sort.Slice(queue, func(i, j int) bool {
			if !queue[i].at.Equal(queue[j].at) {
				return queue[i].at.Before(queue[j].at)
			}
			return queue[i].seq < queue[j].seq
		})
		timer.Reset(time.Until(queue[0].at))
	}
	randDelay := func(maxDelay time.Duration) time.Duration {
		return time.Duration(rng.Int64N(int64(maxDelay) + 1))
	}
	for {
		select {
		case <-s.Done():
			for range frames { // the peer reads on its own after a nil return
			}
			return nil
		case <-timer.C:
			var buf []byte
			now := time.Now()
			for len(queue) > 0 && !queue[0].at.After(now) {
				o := queue[0]
				queue = queue[1:]
				if o.ok {
					state[o.ch] = ""
				} else if state[o.ch] == "closing" {
					res.add(func(r *propResult) { r.lateReplies++ })
				}
				buf = append(buf, o.b...)
			}
			if len(queue) > 0 {
				timer.Reset(time.Until(queue[0].at))
			}
			if len(buf) == 0 {
				continue
			}
			if err := s.Send(buf); err != nil {
				return err
			}
		case f, ok := <-frames:
			if !ok {
				return fmt.Errorf("the client's connection ended before its connection.close: %w", readErr())
			}
			if f.Type == fakepeer.FrameHeartbeat {
				continue
			}
			ch := f.Channel
			c, m := f.Method()
			switch {
			case f.Type != fakepeer.FrameMethod:
				return fmt.Errorf("the client sent %v", f)
			case c == classConnection && m == mConnectionClose:
				a := fakepeer.ReadArgs(f.Args())
				code, text := a.Short(), a.ShortStr()
				if err := s.Send(fakepeer.ConnectionCloseOk()); err != nil {
					return err
				}
				for range frames { // up to the client's end of the socket
				}
				if code != 200 {
					return fmt.Errorf("the client closed the connection with %d %q", code, text)
				}
				return nil
			case c == classChannel && m == mChannelOpen:
				if state[ch] != "" {
					return fmt.Errorf("the client opened channel %d, which is %s", ch, state[ch])
				}
				if everOne[ch] {
					res.add(func(r *propResult) { r.reopens++ })
				}
				everOne[ch] = true
				state[ch] = "open"
				schedule(ch, randDelay(propMaxDelay), fakepeer.ChannelOpenOk(ch), false)
			case c == classChannel && m == mChannelClose:
				if state[ch] != "open" {
					return fmt.Errorf("the client closed channel %d, which is %q", ch, state[ch])
				}
				state[ch] = "closing"
				schedule(ch, randDelay(propMaxDelay/3), fakepeer.ChannelCloseOk(ch), true)
			case c == classQueue || c == classBasic:
				if state[ch] != "open" {
					return fmt.Errorf("the client sent %v on a channel that is %q", f, state[ch])
				}
				reply, d, err := propReply(f, s.FrameMax())
				if err != nil {
					return err
				}
				if reply == nil {
					res.add(func(r *propResult) { r.neverAnswered++ })
					continue
				}
				schedule(ch, d, reply, false)
			default:
				return fmt.Errorf("the client sent %v", f)
			}
		}
	}
}

// propReply returns the reply to a request of the property's workers and
// its delay, as the queue name says; nil for "never".
func propReply(f fakepeer.Frame, frameMax uint32) ([]byte, time.Duration, error) {
	c, m := f.Method()
	a := fakepeer.ReadArgs(f.Args())
	a.Short() // reserved-1 (ticket)
	name := a.ShortStr()
	if err := a.Err(); err != nil {
		return nil, 0, fmt.Errorf("%v: %w", f, err)
	}
	parts := strings.Split(name, "-")
	if len(parts) < 3 || parts[0] != "q" {
		return nil, 0, fmt.Errorf("%v names %q, not a queue of the property", f, name)
	}
	id, err := strconv.ParseUint(parts[1], 10, 32)
	if err != nil {
		return nil, 0, fmt.Errorf("%v names %q: %w", f, name, err)
	}
	if parts[2] == "never" {
		return nil, 0, nil
	}
	ms, err := strconv.Atoi(parts[2])
	if err != nil {
		return nil, 0, fmt.Errorf("%v names %q: %w", f, name, err)
	}
	d := time.Duration(ms) * time.Millisecond
	ch := f.Channel
	switch {
	case c == classQueue && m == 10:
		return fakepeer.QueueDeclareOk(ch, name, uint32(id), uint32(id/100000)), d, nil
	case c == classQueue && m == 30:
		return fakepeer.QueuePurgeOk(ch, uint32(id)), d, nil
	case c == classQueue && m == 40:
		return fakepeer.QueueDeleteOk(ch, uint32(id)), d, nil
	case c == classBasic && m == 70 && strings.HasSuffix(name, "-empty"):
		return fakepeer.BasicGetEmpty(ch), d, nil
	case c == classBasic && m == 70:
		return fakepeer.BasicGetOk(ch, 1, false, "", name, uint32(id), []byte(name), frameMax), d, nil
	}
	return nil, 0, fmt.Errorf("the client sent %v, which the property does not use", f)
}
