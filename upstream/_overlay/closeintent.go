// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// closeIntent records a Close: it wakes waiters, tells it from protocolClose, bounds it (watchdog).
type closeIntent struct {
	mu       sync.Mutex
	calledC  chan struct{} // closed by Close (under mu): wakes DrainEvents callers, refuses publishes and direct hand-overs
	protocol bool          // the close that follows is the library's, after a protocol error
	watchdog *time.Timer
	closeBy  time.Time // when the watchdog fires
}

// newCloseIntent returns a closeIntent before any Close.
func newCloseIntent() closeIntent { return closeIntent{calledC: make(chan struct{})} }

// begin runs in the closing hook: unless the close is the library's own it marks it
// intentional; given a generation (end), it arms a watchdog that ends it and closes conn after timeout.
func (ci *closeIntent) begin(timeout time.Duration, end *genEnd, conn io.Closer) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
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
		if end.setDead(&Error{Code: FrameError, Reason: fmt.Sprintf("close-ok not received within %s: socket closed", timeout)}) {
			_ = conn.Close()
		}
	})
}

// markProtocol says that the next close is the library's.
func (ci *closeIntent) markProtocol() {
	ci.mu.Lock()
	ci.protocol = true
	ci.mu.Unlock()
}

// stopWatchdog runs when the close completed.
func (ci *closeIntent) stopWatchdog() {
	ci.mu.Lock()
	if ci.watchdog != nil {
		ci.watchdog.Stop()
	}
	ci.mu.Unlock()
}

// closeDeadline is when the close under way must be done, if one is.
func (ci *closeIntent) closeDeadline() (time.Time, bool) {
	ci.mu.Lock()
	defer ci.mu.Unlock()
	return ci.closeBy, !ci.closeBy.IsZero()
}

// isCalled reports whether the application has called Close.
func (ci *closeIntent) isCalled() bool { return isClosing(ci.calledC) }

// waitErr is a released waiter's error: the end's, ErrClosedIntentionally after Close, or ErrClosed.
func (ci *closeIntent) waitErr(e *genEnd) error {
	if e.err != nil {
		return e.err
	}
	if ci.isCalled() {
		return ErrClosedIntentionally
	}
	return ErrClosed
}
