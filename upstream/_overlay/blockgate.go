// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// blockGate holds back the publishes that carry a context while the broker
// has blocked the connection (connection.blocked: a memory or disk alarm).
//
// A blocked broker stops reading the publisher's socket, so a publish that
// went ahead would end up in a socket write that no context reaches
// (upstream looks at ctx only on entry), and a frame half written cannot
// be taken back. Waiting here, before anything is written, lets
// PublishWithContext return when its ctx ends and leaves the connection
// intact. Publishes whose ctx cannot end are not held: they behave as
// upstream's do, writing until the socket buffer is full.
//
// Frames already in flight when connection.blocked arrives can still fill
// the socket buffer; Close stays bounded by the read path's CloseTimeout.
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

// unblock releases the held publishes: connection.unblocked, the end of
// the connection (they then fail as upstream's do), or a new generation,
// whose socket the broker has not blocked.
func (b *blockGate) unblock() {
	b.m.Lock()
	defer b.m.Unlock()
	if p := b.blocked.Load(); p != nil {
		close(*p)
		b.blocked.Store(nil)
	}
}

// wait returns nil at once unless the connection is blocked and ctx can
// end; then it waits for the unblock, or returns ctx's error.
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
