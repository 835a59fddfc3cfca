// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// closeIntent records a connection close, for both read modes (readBase embeds it). It does
// three things. It tells the application's Close from the close the library makes itself
// after a broker's protocol error (protocolClose), because their waiters get different
// errors: ErrClosedIntentionally after Close, the broker's error otherwise. Through calledC,
// closed once and never reopened (a Close is for good, recovery included), it wakes
// DrainEvents callers and refuses new publishes and direct hand-overs. And it bounds Close:
// the watchdog ends the generation and closes the socket when the broker's close-ok does not
// come within CloseTimeout, so Close cannot hang on a broker that stopped answering. mu
// guards every field; calledC is also read without it, as a closed-or-not chan.
type closeIntent struct {
	mu       sync.Mutex
	calledC  chan struct{} // closed once, by the application's Close, under mu
	protocol bool          // the close that follows is the library's, after a protocol error
	watchdog *time.Timer   // armed by begin, stopped once the close completed
	closeBy  time.Time     // when the watchdog fires; zero before any close
}

// newCloseIntent returns a closeIntent before any Close.
func newCloseIntent() closeIntent { return closeIntent{calledC: make(chan struct{})} }

// begin runs in the closing hook, as Close starts: unless the close is the library's own
// (markProtocol, which begin clears) it marks it intentional. Given a generation (end), it
// arms a watchdog that, after timeout, ends the generation with a FrameError and closes conn,
// which fails every read and write in progress and so releases whoever waits on them.
func (ci *closeIntent) begin(timeout time.Duration, end *genEnd, conn io.Closer) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	// A protocol close consumes its mark: a later Close by the application is intentional.
	if ci.protocol {
		ci.protocol = false
	} else if !isClosing(ci.calledC) {
		close(ci.calledC)
	}
	if end == nil {
		return
	}
	ci.closeBy = time.Now().Add(timeout)
	ci.watchdog = time.AfterFunc(timeout, func() {
		reason := fmt.Sprintf("close-ok not received within %s: socket closed", timeout)
		// Only the end that wins closes the socket: a generation that ended otherwise
		// in the meantime has closed it already.
		if end.setDead(&Error{Code: FrameError, Reason: reason}) {
			_ = conn.Close()
		}
	})
}

// markProtocol says that the next close is the library's, after a broker's protocol error,
// so that begin does not mark it intentional and waiters get the broker's error.
func (ci *closeIntent) markProtocol() {
	ci.mu.Lock()
	ci.protocol = true
	ci.mu.Unlock()
}

// stopWatchdog runs when the close completed cleanly (shutdown without an error): the
// close-ok came, so the timer is stopped rather than left to fire on an end that is over.
func (ci *closeIntent) stopWatchdog() {
	ci.mu.Lock()
	if ci.watchdog != nil {
		ci.watchdog.Stop()
	}
	ci.mu.Unlock()
}

// closeDeadline is when the close under way must be done, if one is: the drainer's flush
// waits for its dispatchers up to then, not longer.
func (ci *closeIntent) closeDeadline() (time.Time, bool) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return ci.closeBy, !ci.closeBy.IsZero()
}

// isCalled reports whether the application has called Close; without mu, since calledC
// only ever goes from open to closed.
func (ci *closeIntent) isCalled() bool { return isClosing(ci.calledC) }

// waitErr is a released waiter's error: the end's if it has one, ErrClosedIntentionally
// after Close, else ErrClosed.
func (ci *closeIntent) waitErr(e *genEnd) error {
	if e.err != nil {
		return e.err
	}
	if ci.isCalled() {
		return ErrClosedIntentionally
	}
	return ErrClosed
}
