// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Unit tests of genEnd and closeIntent (readconn.go and closeintent.go), how a generation of the
// read modes ends and the watchdog that bounds Close: no broker, no
// socket, on synctest's fake clock.

// closeRecorder is the socket the watchdog closes: it records when, and
// how often.
type closeRecorder struct {
	start time.Time
	calls atomic.Int32
	at    atomic.Int64 // time.Duration since start of the last Close
}

func (c *closeRecorder) Close() error {
	c.calls.Add(1)
	c.at.Store(int64(time.Since(c.start)))
	return nil
}

// TestUnitGenEndSetDeadOnce pins that a generation ends exactly once:
// of sixteen concurrent setDead calls one reports that it ended it, its
// error is the one kept, the dead chan is closed (which releases every
// waiter together), and later calls change nothing.
func TestUnitGenEndSetDeadOnce(t *testing.T) {
	e := newGenEnd()
	if e.isDead() {
		t.Fatal("a new generation is dead")
	}
	errs := make([]*Error, 16)
	won := make([]bool, len(errs))
	var wg sync.WaitGroup
	for i := range errs {
		i := i
		errs[i] = &Error{Code: FrameError, Reason: "cause"}
		wg.Add(1)
		go func() {
			defer wg.Done()
			won[i] = e.setDead(errs[i])
		}()
	}
	waiters := make(chan struct{}, 4)
	for i := 0; i < cap(waiters); i++ {
		go func() {
			<-e.dead
			waiters <- struct{}{}
		}()
	}
	wg.Wait()
	first := -1
	for i, w := range won {
		if w {
			if first >= 0 {
				t.Fatalf("setDead calls %d and %d both ended the generation", first, i)
			}
			first = i
		}
	}
	if first < 0 {
		t.Fatal("no setDead call ended the generation")
	}
	if e.err != errs[first] {
		t.Fatalf("the generation kept %p, not the error of the call that ended it (%p)", e.err, errs[first])
	}
	for i := 0; i < cap(waiters); i++ {
		<-waiters
	}
	if e.setDead(nil) || e.err != errs[first] || !e.isDead() {
		t.Fatal("a later setDead changed the end")
	}
}

// TestUnitGenEndExplain pins explain, which replaces a failed socket write's
// error with the cause of the end when the end broke the socket: nil stays
// nil, a live generation or an intentional end (nil cause) keeps the write
// error, and a generation ended with a cause returns that cause.
func TestUnitGenEndExplain(t *testing.T) {
	writeErr := errors.New("use of closed network connection")
	live := newGenEnd()
	if live.explain(nil) != nil || live.explain(writeErr) != writeErr {
		t.Fatal("a live generation changed an error")
	}
	intentional := newGenEnd()
	intentional.setDead(nil)
	if intentional.explain(writeErr) != writeErr {
		t.Fatal("an intentional end hid the write error")
	}
	cause := &Error{Code: FrameError, Reason: "close-ok not received within 5s: socket closed"}
	failed := newGenEnd()
	failed.setDead(cause)
	if failed.explain(nil) != nil {
		t.Fatal("explain(nil) is not nil")
	}
	if got := failed.explain(writeErr); got != cause {
		t.Fatalf("explain = %v, want the cause %v", got, cause)
	}
}

// TestUnitCloseWatchdogFiresAtDeadline pins the Close watchdog on the fake
// clock: begin marks the close intentional (calledC closed), closeDeadline
// is now plus the timeout, and at exactly that time, not a nanosecond
// earlier, the watchdog ends the generation with a FrameError naming the
// timeout and closes the socket once. Waiters and a write that then fails
// get that error.
func TestUnitCloseWatchdogFiresAtDeadline(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		const timeout = 5 * time.Second
		ci := newCloseIntent()
		end := newGenEnd()
		sock := &closeRecorder{start: time.Now()}
		if _, ok := ci.closeDeadline(); ok {
			t.Fatal("a close deadline before any close")
		}
		ci.begin(timeout, &end, sock)
		if !isClosed(ci.calledC) || !ci.isCalled() {
			t.Fatal("begin did not mark the close intentional")
		}
		if by, ok := ci.closeDeadline(); !ok || by.Sub(sock.start) != timeout {
			t.Fatalf("closeDeadline = %v, %v; want start+%s", by, ok, timeout)
		}
		time.Sleep(timeout - time.Nanosecond)
		if end.isDead() || sock.calls.Load() != 0 {
			t.Fatal("the watchdog fired before its deadline")
		}
		time.Sleep(time.Nanosecond)
		<-end.dead
		synctest.Wait() // the watchdog closes the socket after it ended the generation
		if n, at := sock.calls.Load(), time.Duration(sock.at.Load()); n != 1 || at != timeout {
			t.Fatalf("socket closed %d times, last at %s; want once at %s", n, at, timeout)
		}
		want := "Exception (501) Reason: \"close-ok not received within 5s: socket closed\""
		if end.err == nil || end.err.Code != FrameError || end.err.Error() != want {
			t.Fatalf("the watchdog ended the generation with %v, want %s", end.err, want)
		}
		if got := ci.waitErr(&end); got != end.err {
			t.Fatalf("waitErr = %v, want the watchdog's error", got)
		}
		if got := end.explain(errors.New("write: broken pipe")); got != end.err {
			t.Fatalf("explain = %v, want the watchdog's error", got)
		}
		ci.stopWatchdog() // after it fired: harmless
		time.Sleep(time.Hour)
		if n := sock.calls.Load(); n != 1 {
			t.Fatalf("socket closed %d times", n)
		}
	})
}

// TestUnitCloseWatchdogStopped pins stopWatchdog, which runs when the
// close completed in time: the watchdog never fires after it, the
// generation is not ended by it and the socket is not closed by it, and
// a waiter released by the close's own end gets ErrClosedIntentionally.
func TestUnitCloseWatchdogStopped(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ci := newCloseIntent()
		end := newGenEnd()
		sock := &closeRecorder{start: time.Now()}
		ci.begin(time.Second, &end, sock)
		time.Sleep(999 * time.Millisecond)
		ci.stopWatchdog()
		end.setDead(nil) // the close's own end
		time.Sleep(time.Hour)
		if n := sock.calls.Load(); n != 0 {
			t.Fatalf("a stopped watchdog closed the socket %d times", n)
		}
		if got := ci.waitErr(&end); got != ErrClosedIntentionally {
			t.Fatalf("waitErr = %v, want ErrClosedIntentionally", got)
		}
	})
}

// TestUnitCloseWatchdogAfterEnd pins that a watchdog that fires after the
// generation already ended (a read failure, the broker's close) changes
// nothing: it does not close the socket a second time and does not replace
// the cause that ended it.
func TestUnitCloseWatchdogAfterEnd(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ci := newCloseIntent()
		end := newGenEnd()
		sock := &closeRecorder{start: time.Now()}
		ci.begin(time.Second, &end, sock)
		cause := &Error{Code: ConnectionForced, Reason: "broker shutdown"}
		time.Sleep(500 * time.Millisecond)
		end.setDead(cause)
		time.Sleep(time.Hour)
		if n := sock.calls.Load(); n != 0 {
			t.Fatalf("the watchdog closed the socket of an ended generation %d times", n)
		}
		if end.err != cause || ci.waitErr(&end) != cause {
			t.Fatalf("the cause became %v", end.err)
		}
	})
}

// TestUnitCloseIntentProtocol pins markProtocol: the close that follows it
// is the library's (after a protocol error), so it arms the watchdog but
// does not mark the close intentional, and a waiter gets ErrClosed or the
// cause (waitErr is only asked once the generation ended: it reads the
// cause without a lock, after the dead chan); the mark is used up, so the application's Close after it is
// intentional again. begin without a generation (legacy mode between
// generations) arms nothing.
func TestUnitCloseIntentProtocol(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ci := newCloseIntent()
		end := newGenEnd()
		sock := &closeRecorder{start: time.Now()}
		ci.markProtocol()
		ci.begin(time.Second, &end, sock)
		if isClosed(ci.calledC) || ci.isCalled() {
			t.Fatal("the library's own close was taken for the application's")
		}
		if _, ok := ci.closeDeadline(); !ok {
			t.Fatal("the library's close armed no watchdog")
		}
		ended := newGenEnd() // another generation, ended without a cause
		ended.setDead(nil)
		if got := ci.waitErr(&ended); got != ErrClosed {
			t.Fatalf("waitErr = %v, want ErrClosed", got)
		}
		time.Sleep(time.Second)
		<-end.dead
		if got := ci.waitErr(&end); got != end.err || end.err == nil {
			t.Fatalf("waitErr = %v, want the watchdog's cause", got)
		}

		ci2 := newCloseIntent()
		ci2.markProtocol()
		ci2.begin(time.Second, nil, nil)
		ci2.begin(time.Second, nil, nil) // the application's Close
		if !isClosed(ci2.calledC) || !ci2.isCalled() {
			t.Fatal("the protocol mark was not used up by the close after it")
		}
		if _, ok := ci2.closeDeadline(); ok {
			t.Fatal("begin without a generation armed a watchdog")
		}
		ci2.stopWatchdog() // no watchdog: harmless
		if got := ci2.waitErr(&ended); got != ErrClosedIntentionally {
			t.Fatalf("waitErr = %v, want ErrClosedIntentionally", got)
		}
	})
}
