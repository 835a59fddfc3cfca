// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"fmt"
	"sync/atomic"
)

// blockGate holds publishes whose ctx can end while the broker blocks the connection
// (connection.blocked, a resource alarm: it stops reading the socket), before anything is
// written, so PublishWithContext returns at ctx's end with the connection intact. Other
// publishes write as upstream's; Close stays bounded by the read path's CloseTimeout.
//
// Why before the write: once a publish has started writing to a socket the broker no longer
// reads, it can only be stopped by closing the socket, halfway through a frame, which ends the
// connection. Held at the gate, it has written nothing, so it can give up cleanly.
//
// The gate is an atomic pointer so that a publish on an unblocked connection, the common case,
// costs one atomic load and no lock. block sets a chan only where none is (CompareAndSwap) and
// unblock takes it out (Swap), so that one chan serves a block and is closed once; a publish
// that loaded the chan before an unblock still sees it closed. Every end of a block releases
// the gate: connection.unblocked, the connection's end (readBase.shutdown) and a new
// generation (readBase.install), whose socket starts unblocked.
type blockGate struct {
	blocked atomic.Pointer[chan struct{}] // set while blocked, closed at unblock
}

// block marks the connection blocked (connection.blocked). A second connection.blocked
// while blocked keeps the chan: the one unblock releases every publish held since the first.
func (b *blockGate) block() {
	ch := make(chan struct{})
	b.blocked.CompareAndSwap(nil, &ch)
}

// unblock releases the held publishes: connection.unblocked, the end, or a new generation.
func (b *blockGate) unblock() {
	if p := b.blocked.Swap(nil); p != nil {
		close(*p)
	}
}

// wait returns nil unless blocked with a ctx that can end: then at the unblock, or ctx's
// error. A ctx that cannot end (Done nil) passes at once and writes as upstream's would.
func (b *blockGate) wait(ctx context.Context) error {
	p := b.blocked.Load()
	if p == nil || ctx.Done() == nil {
		return nil
	}
	select {
	case <-*p:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("amqp: publish held while the broker blocks the connection "+
			"(connection.blocked): %w", ctx.Err())
	}
}
