// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

// autoDrain is AutoDrain's goroutine for g: a holder of g's read turn, as the drainer's
// goroutine is (holdTurn), so that a program that never calls DrainEvents still gets its
// deliveries, confirms and heartbeats. It keeps the turn and reads; a reply waiter still
// competes for the turn, but wins it only when it is free (between a lend's two halves,
// or once AutoDrain ended), and otherwise gets its reply from AutoDrain's reads, as
// DrainEvents waits for them. It lends the turn to a waiting ConsumeFunc, and every
// write cuts its read short (transportGuard). What differs from the drainer is only what
// a routed frame does: legacy dispatches it inline.
//
// It ends at g's end, or at Close on a net.Conn: there its reads would be cut short for
// ever (cutFor), and Close's own wait takes the turn and reads its close-ok. Over another
// conn (io.Pipe) a read cannot be cut short, so it reads on until g ends, alongside Close,
// or a peer writing to us would block the close.
func (l *legacyConn) autoDrain(g *readGen) {
	before := func() (bool, *Error) {
		return l.isCalled() && g.read.nc != nil, nil
	}
	if err := l.holdTurn(g, before); err != nil {
		l.fail(g, err)
	}
}
