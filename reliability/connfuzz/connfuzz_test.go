package connfuzz

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/fakepeer"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestMain runs the goroutine leak check once all tests are done, on top
// of the per-input check FuzzConnection makes itself.
func TestMain(m *testing.M) { testenv.Main(m) }

// callBound is how long a call, or a wait for an event the client owes,
// may take in the tests other than FuzzConnection before it counts as a
// hang. It is generous on purpose: the machine is shared and -race slows
// everything down, and a real hang is forever, so a loose bound loses
// nothing.
const callBound = 20 * time.Second

// inputBound is how long one whole input of FuzzConnection may take, the
// peer's cleanup and the leak check aside. The fuzzing engine kills a
// worker whose input runs for 10 s, cleanup and leak check included, and
// reports only that it "hung" (while minimizing, it does not even keep the
// input that did); failing at 5 s instead names the call that hung. A
// normal input takes milliseconds; the longest legitimate wait is
// closeTimeout.
const inputBound = 5 * time.Second

// closeTimeout bounds how long Close waits for close-ok in drainer and
// legacy mode, instead of their default 5 s, so that an input where the
// peer never answers stays well within inputBound.
const closeTimeout = 2 * time.Second

// heartbeat is the heartbeat the client asks for. Upstream's reader, once
// parked (see TestUnexpectedChannelZeroMethodIsTakenAsAReply), notices a
// peer that closed the socket only when a heartbeat write fails: with the
// default 10 s heartbeat that alone overruns inputBound. The peer never
// sends heartbeats, so a connection idle for 1.5 s is declared dead,
// which every input is far from, and would be a fine outcome anyway.
const heartbeat = time.Second

// drainSlice is how long one DrainEvents call may wait. Short, as an
// application polling between other work would use it: in legacy mode a
// blocked read holds the transport lock, and the deliveries' acks written
// by another goroutine wait for the read to end.
const drainSlice = 10 * time.Millisecond

// The names the client uses, which the seeds must match for a delivery to
// reach the consumer.
const (
	fuzzChannel = 1 // the first channel a connection opens
	consumerTag = "fuzz"
	queueName   = "fuzz"
)

// fuzzModes maps the mode octet of an input to a read mode. All three are
// fuzzed: see doc.go for the one input shape excluded from every mode.
var fuzzModes = [...]compat.Mode{compat.Upstream, compat.Legacy, compat.Drainer}

// ending is how the peer ends the connection once the stream is sent.
type ending int

const (
	// endClose closes the socket: the client reads end of stream after
	// whatever the stream left in flight.
	endClose ending = iota
	// endReset closes the socket with a RST: the client's read fails.
	endReset
	// endGraceful keeps the socket until the client's own Close, answers
	// its connection.close with close-ok, then closes. If the stream left
	// a partial frame the close-ok completes it as garbage, and the client
	// only finds out when the socket closes.
	endGraceful
)

func (e ending) String() string {
	return [...]string{"close", "reset", "graceful"}[e]
}

// maxWrites caps the writes one stream is cut into, so that a long input
// with a small slice size costs no more than a short one.
const maxWrites = 256

// input is one fuzz input, decoded.
type input struct {
	mode   compat.Mode
	end    ending
	slice  int // octets per write; 0 sends the stream in one write
	stream []byte
}

// decode turns the fuzz arguments into an input. Every value of every
// argument is valid, so that the fuzzer wastes no executions: the mode
// octet is taken modulo the number of modes; the control octet's low two
// bits select the ending (3 is graceful too) and its upper six bits the
// slice size. Outside drainer mode, the tags of multiple acks and nacks
// are capped (boundAckMultiple).
func decode(mode, ctl uint8, stream []byte) input {
	in := input{
		mode:   fuzzModes[int(mode)%len(fuzzModes)],
		end:    ending(min(int(ctl&3), int(endGraceful))),
		slice:  int(ctl >> 2),
		stream: stream,
	}
	if in.mode != compat.Drainer {
		in.stream = boundAckMultiple(stream)
	}
	if in.slice > 0 && len(in.stream) > in.slice*maxWrites {
		in.slice = (len(in.stream) + maxWrites - 1) / maxWrites
	}
	return in
}

func (in input) String() string {
	return fmt.Sprintf("%v mode, %d octets in slices of %d, then %v", in.mode, len(in.stream), in.slice, in.end)
}

// FuzzConnection feeds the whole connection, in every read mode, the
// frames of a mutated broker: see the package documentation for what each
// input must satisfy. The arguments are the read mode, a control octet
// (ending and slicing, see decode) and the octets the peer sends after the
// setup.
func FuzzConnection(f *testing.F) {
	level.Require(f)
	for i, s := range seeds() {
		// Every seed in every mode; the ending and the slicing vary with
		// the seed so that all of them are covered without tripling the
		// seed count again.
		ctl := uint8(i%3) | uint8(i%5*3)<<2
		for m := range fuzzModes {
			f.Add(uint8(m), ctl, s.stream)
		}
	}
	f.Fuzz(func(t *testing.T, mode, ctl uint8, stream []byte) {
		recordInput(mode, ctl, stream)
		in := decode(mode, ctl, stream)
		if in.mode == compat.Upstream && mayCarryBlocked(in.stream) {
			t.Skip("upstream mode can crash on connection.blocked: see TestBlockedNotificationRacesShutdown")
		}
		run(t, in)
	})
}

// outcome collects what the client saw, to check after the run.
type outcome struct {
	mu   sync.Mutex
	errs []error // every error some call returned, with what returned it
}

func (o *outcome) add(what string, err error) {
	if err == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, fmt.Errorf("%s: %w", what, err))
}

// run plays one input and checks it.
func run(t *testing.T, in input) {
	t.Logf("input: %v", in)
	// Registered first so that it runs last, after the peer's cleanup has
	// stopped the peer's goroutines: whatever is left then is the
	// client's.
	leakBaseline := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(leakBaseline); err != nil {
			t.Errorf("goroutines left behind after %v: %v", in, err)
		}
	})

	end := time.Now().Add(inputBound)
	left := func() time.Duration { return time.Until(end) }
	sent := make(chan struct{})
	peer := listen(t, inputBound, func(s *fakepeer.Session) error { return serve(s, in, sent) })

	conn := within(t, left(), "dial", func() result[*amqp.Connection] {
		c, err := compat.DialConfig(peer.URL(), amqp.Config{Heartbeat: heartbeat}, in.mode,
			compat.WithDrainerOptions(amqp.DrainerOptions{CloseTimeout: closeTimeout}),
			compat.WithLegacyOptions(amqp.LegacyOptions{CloseTimeout: closeTimeout}))
		return result[*amqp.Connection]{c, err}
	}).get(t)
	// connDone is read by this goroutine only: when it yields a value or
	// is closed, the connection has ended.
	connDone := conn.NotifyClose(make(chan *amqp.Error, 1))
	var out outcome
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var workers sync.WaitGroup
	stop := sync.OnceFunc(func() {
		cancel()
		waitGroup(t, left(), &workers, "DrainEvents and WaitContext")
	})
	// Also on a failed run, so that one failure does not report a leak
	// on top.
	defer stop()

	ch := within(t, left(), "Channel", func() result[*amqp.Channel] {
		c, err := conn.Channel()
		return result[*amqp.Channel]{c, err}
	}).get(t)
	within(t, left(), "Confirm", func() result[struct{}] {
		return result[struct{}]{err: ch.Confirm(false)}
	}).get(t)
	ls := newListeners(conn, ch)
	ls.deliveries = within(t, left(), "Consume", func() result[<-chan amqp.Delivery] {
		d, err := ch.Consume(queueName, consumerTag, false, false, false, false, nil)
		return result[<-chan amqp.Delivery]{d, err}
	}).get(t)
	dc := within(t, left(), "Publish", func() result[*amqp.DeferredConfirmation] {
		d, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queueName, true, false,
			amqp.Publishing{Body: []byte("fuzz")})
		return result[*amqp.DeferredConfirmation]{d, err}
	}).get(t)

	// DrainEvents in every mode: legacy needs it to read at all, and the
	// other modes must give it the same guarantees. Only from here: the
	// setup's calls read for themselves in legacy mode, and a DrainEvents
	// call blocked in a read would hold up each of their writes for up to
	// drainSlice, which costs fuzzing throughput and covers nothing the
	// stream does.
	workers.Add(1)
	go func() {
		defer workers.Done()
		drainLoop(ctx, conn, &out)
	}()
	// The confirmation of the one publish may come, or not; either way
	// the wait must end, with a confirmation or when the run ends.
	workers.Add(1)
	go func() {
		defer workers.Done()
		_, err := dc.WaitContext(ctx)
		if !errors.Is(err, context.Canceled) {
			out.add("DeferredConfirmation.WaitContext", err)
		}
	}()
	listened := make(chan struct{})
	go func() {
		defer close(listened)
		ls.listen(&out)
	}()

	// The connection ends by itself after endClose and endReset, or
	// sooner if the stream made the client give up. After endGraceful it
	// ends when the application closes it, once the peer has sent it all.
	var connErr *amqp.Error
	ended := false
	wait := sent
	if in.end != endGraceful {
		wait = nil
	}
	select {
	case connErr = <-connDone:
		ended = true
	case <-wait:
	case <-time.After(left()):
		t.Fatalf("%v: the connection did not end within %s of the start", in, inputBound)
	}
	closeErr := within(t, left(), "Close", func() result[struct{}] {
		return result[struct{}]{err: conn.Close()}
	}).err
	if in.mode == compat.Upstream && isWriteError(closeErr) {
		// Upstream's own race, which upstream mode must keep: see
		// TestUpstreamCloseCanReturnTheWriteError.
		t.Logf("Close: %v", closeErr)
		closeErr = nil
	}
	out.add("Close", closeErr)
	if !ended {
		select {
		case connErr = <-connDone:
		case <-time.After(left()):
			t.Fatalf("%v: NotifyClose was neither sent to nor closed after Close, %s from the start", in, inputBound)
		}
	}
	if connErr != nil {
		t.Logf("connection ended: %v", connErr)
	}
	// Close ends the channel, which closes every listener.
	select {
	case <-listened:
	case <-time.After(left()):
		t.Fatalf("%v: listener channels still open after Close, %s from the start: %v", in, inputBound, ls.open())
	}

	// Ending ctx must end DrainEvents and WaitContext at once; only then
	// are their errors all in.
	stop()
	out.mu.Lock()
	defer out.mu.Unlock()
	for _, err := range out.errs {
		if !isAMQPError(err) {
			t.Errorf("%v: an error that is not an *amqp.Error: %v (%T)", in, err, errors.Unwrap(err))
		}
	}
}

// isAMQPError reports whether err is, or wraps, an *amqp.Error, as every
// error a connection returns for what the broker sent must be.
func isAMQPError(err error) bool {
	var e *amqp.Error
	return errors.As(err, &e)
}

// drainLoop calls DrainEvents until the connection reports its end or ctx
// ends, recording every error other than the end of a slice.
func drainLoop(ctx context.Context, conn *amqp.Connection, out *outcome) {
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, drainSlice)
		err := conn.DrainEvents(dctx)
		cancel()
		switch {
		case err == nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		default:
			out.add("DrainEvents", err)
			return
		}
	}
}

// startDrainLoop runs drainLoop on its own goroutine, as FuzzConnection
// does, recording nothing: the reproducers check their own outcome. The
// returned stop ends the loop and fails t if it does not end in time.
func startDrainLoop(t *testing.T, conn *amqp.Connection) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var drainer sync.WaitGroup
	drainer.Add(1)
	go func() {
		defer drainer.Done()
		drainLoop(ctx, conn, new(outcome))
	}()
	return func() {
		cancel()
		waitGroup(t, callBound, &drainer, "DrainEvents")
	}
}

// result is what a bounded call returned.
type result[T any] struct {
	v   T
	err error
}

// get returns the value, failing t on an error: the calls that use it
// run before the peer sends anything unusual, so they must succeed.
func (r result[T]) get(t *testing.T) T {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.v
}

// within runs f on its own goroutine and fails t if it does not return
// within limit, so that a hang fails the input instead of stalling the
// fuzzer.
func within[T any](t *testing.T, limit time.Duration, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(limit):
		t.Fatalf("%s did not return within %s", what, limit.Round(time.Millisecond))
		panic("unreachable")
	}
}

// waitGroup waits for wg, failing t if that takes longer than limit.
func waitGroup(t *testing.T, limit time.Duration, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		t.Errorf("%s did not end within %s", what, limit.Round(time.Millisecond))
	}
}
