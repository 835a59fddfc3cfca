// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// blockGate holds publishes whose ctx can end while the broker blocks the connection
// (connection.blocked, a resource alarm: it stops reading the socket), before anything is
// written, so PublishWithContext returns at ctx's end with the connection intact. Other
// publishes write as upstream's; Close stays bounded by the read path's CloseTimeout.
type blockGate struct {
	m       sync.Mutex                    // serialises block and unblock
	blocked atomic.Pointer[chan struct{}] // set while blocked, closed at unblock
}

// block marks the connection blocked (connection.blocked).
func (b *blockGate) block() {
	b.m.Lock()
	defer b.m.Unlock()
	if b.blocked.Load() == nil {
		ch := make(chan struct{})
		b.blocked.Store(&ch)
	}
}

// unblock releases the held publishes: connection.unblocked, the end, or a new generation.
func (b *blockGate) unblock() {
	b.m.Lock()
	defer b.m.Unlock()
	if p := b.blocked.Swap(nil); p != nil {
		close(*p)
	}
}

// wait returns nil unless blocked with a ctx that can end: then at the unblock, or ctx's error.
func (b *blockGate) wait(ctx context.Context) error {
	p := b.blocked.Load()
	if p == nil || ctx.Done() == nil {
		return nil
	}
	select {
	case <-*p:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("amqp: publish held while the broker blocks the connection (connection.blocked): %w", ctx.Err())
	}
}
