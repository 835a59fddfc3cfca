// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
)

// The context variants of the synchronous methods (bounded.go runs them; RPCError says what
// a ctx that ends first does). Each of Channel's but CloseWithContext runs the upstream method
// of its name, so it checks its arguments, records topology for recovery and fails as that
// method does, with its wait bounded by ctx; a ctx whose Done is nil (context.Background())
// cannot end, so the method runs inline on the caller's goroutine, at no extra cost.
//
// Why a goroutine and not a ctx passed down: upstream's methods block in several places (the
// write lock, the socket write, the reply wait, in legacy mode a read by another goroutine),
// none of which takes a ctx. Running the method on its own goroutine bounds all of them at
// once, and leaves upstream's code untouched.

// QosWithContext is Qos, bounded by ctx (see RPCError).
func (ch *Channel) QosWithContext(ctx context.Context, prefetchCount, prefetchSize int,
	global bool) error {
	return ch.bounded(ctx, "basic.qos", func() error {
		return ch.Qos(prefetchCount, prefetchSize, global)
	})
}

// CancelWithContext is Cancel, bounded by ctx (see RPCError).
func (ch *Channel) CancelWithContext(ctx context.Context, consumer string, noWait bool) error {
	return ch.bounded(ctx, "basic.cancel", func() error { return ch.Cancel(consumer, noWait) })
}

// QueueDeclareWithContext is QueueDeclare, bounded by ctx (see RPCError).
func (ch *Channel) QueueDeclareWithContext(ctx context.Context, name string,
	durable, autoDelete, exclusive, noWait bool, args Table) (Queue, error) {
	return boundedValue(ctx, ch, "queue.declare", func() (Queue, error) {
		return ch.QueueDeclare(name, durable, autoDelete, exclusive, noWait, args)
	})
}

// QueueDeclarePassiveWithContext is QueueDeclarePassive, bounded by ctx (see RPCError).
func (ch *Channel) QueueDeclarePassiveWithContext(ctx context.Context, name string,
	durable, autoDelete, exclusive, noWait bool, args Table) (Queue, error) {
	return boundedValue(ctx, ch, "queue.declare", func() (Queue, error) {
		return ch.QueueDeclarePassive(name, durable, autoDelete, exclusive, noWait, args)
	})
}

// QueueBindWithContext is QueueBind, bounded by ctx (see RPCError).
func (ch *Channel) QueueBindWithContext(ctx context.Context, name, key, exchange string,
	noWait bool, args Table) error {
	return ch.bounded(ctx, "queue.bind", func() error {
		return ch.QueueBind(name, key, exchange, noWait, args)
	})
}

// QueueUnbindWithContext is QueueUnbind, bounded by ctx (see RPCError).
func (ch *Channel) QueueUnbindWithContext(ctx context.Context, name, key, exchange string,
	args Table) error {
	return ch.bounded(ctx, "queue.unbind", func() error {
		return ch.QueueUnbind(name, key, exchange, args)
	})
}

// QueuePurgeWithContext is QueuePurge, bounded by ctx (see RPCError).
func (ch *Channel) QueuePurgeWithContext(ctx context.Context, name string,
	noWait bool) (int, error) {
	return boundedValue(ctx, ch, "queue.purge", func() (int, error) {
		return ch.QueuePurge(name, noWait)
	})
}

// QueueDeleteWithContext is QueueDelete, bounded by ctx (see RPCError).
func (ch *Channel) QueueDeleteWithContext(ctx context.Context, name string,
	ifUnused, ifEmpty, noWait bool) (int, error) {
	return boundedValue(ctx, ch, "queue.delete", func() (int, error) {
		return ch.QueueDelete(name, ifUnused, ifEmpty, noWait)
	})
}

// ExchangeDeclareWithContext is ExchangeDeclare, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeDeclareWithContext(ctx context.Context, name, kind string,
	durable, autoDelete, internal, noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.declare", func() error {
		return ch.ExchangeDeclare(name, kind, durable, autoDelete, internal, noWait, args)
	})
}

// ExchangeDeclarePassiveWithContext is ExchangeDeclarePassive, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeDeclarePassiveWithContext(ctx context.Context, name, kind string,
	durable, autoDelete, internal, noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.declare", func() error {
		return ch.ExchangeDeclarePassive(name, kind, durable, autoDelete, internal, noWait, args)
	})
}

// ExchangeDeleteWithContext is ExchangeDelete, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeDeleteWithContext(ctx context.Context, name string,
	ifUnused, noWait bool) error {
	return ch.bounded(ctx, "exchange.delete", func() error {
		return ch.ExchangeDelete(name, ifUnused, noWait)
	})
}

// ExchangeBindWithContext is ExchangeBind, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeBindWithContext(ctx context.Context, destination, key, source string,
	noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.bind", func() error {
		return ch.ExchangeBind(destination, key, source, noWait, args)
	})
}

// ExchangeUnbindWithContext is ExchangeUnbind, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeUnbindWithContext(ctx context.Context, destination, key,
	source string, noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.unbind", func() error {
		return ch.ExchangeUnbind(destination, key, source, noWait, args)
	})
}

// GetWithContext is Get, bounded by ctx (see RPCError).
func (ch *Channel) GetWithContext(ctx context.Context, queue string,
	autoAck bool) (Delivery, bool, error) {
	type got struct {
		msg Delivery
		ok  bool
	}
	g, err := boundedValue(ctx, ch, "basic.get", func() (got, error) {
		msg, ok, err := ch.Get(queue, autoAck)
		return got{msg, ok}, err
	})
	return g.msg, g.ok, err
}

// TxWithContext is Tx, bounded by ctx (see RPCError).
func (ch *Channel) TxWithContext(ctx context.Context) error {
	return ch.bounded(ctx, "tx.select", ch.Tx)
}

// TxCommitWithContext is TxCommit, bounded by ctx (see RPCError). Whether a commit whose ctx
// ended was carried out is unknown: the channel is closed, which rolls back only a
// transaction the broker had not committed yet.
func (ch *Channel) TxCommitWithContext(ctx context.Context) error {
	return ch.bounded(ctx, "tx.commit", ch.TxCommit)
}

// TxRollbackWithContext is TxRollback, bounded by ctx (see RPCError).
func (ch *Channel) TxRollbackWithContext(ctx context.Context) error {
	return ch.bounded(ctx, "tx.rollback", ch.TxRollback)
}

// FlowWithContext is Flow, bounded by ctx (see RPCError).
func (ch *Channel) FlowWithContext(ctx context.Context, active bool) error {
	return ch.bounded(ctx, "channel.flow", func() error { return ch.Flow(active) })
}

// ConfirmWithContext is Confirm, bounded by ctx (see RPCError).
func (ch *Channel) ConfirmWithContext(ctx context.Context, noWait bool) error {
	return ch.bounded(ctx, "confirm.select", func() error { return ch.Confirm(noWait) })
}

// RecoverWithContext is Recover, bounded by ctx (see RPCError).
func (ch *Channel) RecoverWithContext(ctx context.Context, requeue bool) error {
	return ch.bounded(ctx, "basic.recover", func() error { return ch.Recover(requeue) })
}

// ConsumeWithRPCContext is Consume, its basic.consume round trip bounded by ctx (see
// RPCError); afterwards ctx does nothing, where upstream's ConsumeWithContext's ctx cancels
// the consumer when it ends.
func (ch *Channel) ConsumeWithRPCContext(ctx context.Context, queue, consumer string,
	autoAck, exclusive, noLocal, noWait bool, args Table) (<-chan Delivery, error) {
	return boundedValue(ctx, ch, "basic.consume", func() (<-chan Delivery, error) {
		return ch.Consume(queue, consumer, autoAck, exclusive, noLocal, noWait, args)
	})
}

// CloseWithContext is Close, bounded by ctx. The channel is closed for the application at once
// (deliveries, listeners and waiters as by Close), and it returns the close handshake's error, or
// nil for a channel already closed. If ctx ends first it returns an *RPCError, and the channel's id
// stays reserved until the broker answers or the connection ends.
func (ch *Channel) CloseWithContext(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	if ctx.Done() == nil {
		return ch.Close()
	}
	// The stand-in takes the id now: ch is closed for the application at once, and the
	// close-ok, whenever it comes, goes to the stand-in, which holds the id until then.
	stand := ch.abandonToStandIn()
	if stand == nil {
		return nil // closed or closing already, as Close finds it
	}
	// sent receives retire's error: whether the channel.close was written. Buffered, so the
	// retiring goroutine never waits for a caller who left; giveUp then reads it instead.
	sent := make(chan error, 1)
	go func() { sent <- ch.retire(stand, "kthxbai", nil) }() // Connection.Close's reply text
	// giveUp leaves the rest to a background goroutine: it waits for the close-ok if the
	// close was sent, then releases the id.
	giveUp := func() error {
		go func() { stand.closeInBackground(<-sent) }()
		return &RPCError{Method: "channel.close", Channel: ch.id, Err: context.Cause(ctx),
			Closed: true}
	}
	// Two waits, each bounded by ctx: the close's write (legacy mode may have to wait for a
	// read to end first), then the broker's close-ok. A failed write needs no close-ok.
	var err error
	select {
	case err = <-sent:
	case <-ctx.Done():
		return giveUp()
	}
	if err == nil {
		err = stand.awaitCloseOk(ctx, true)
		if err != nil && ctx.Err() != nil {
			sent <- nil // sent already: wait for the close-ok in the background
			return giveUp()
		}
	}
	// The close-ok came (or the close failed): the id is free for the next channel.
	ch.connection.dropStandIn(stand)
	return err
}

// ChannelWithContext is Channel, with the channel.open round trip bounded by ctx. If ctx ends first
// it returns an *RPCError (see RPCError); the id it had taken stays reserved until the broker has
// answered the open and the channel.close that follows, so a late channel.open-ok is never taken
// for another channel's reply.
func (c *Connection) ChannelWithContext(ctx context.Context) (*Channel, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	// As runBounded: a ctx that cannot end runs upstream's Channel inline, and an ended one
	// takes no id and sends nothing.
	if ctx.Done() == nil {
		return c.Channel()
	}
	if ctx.Err() != nil {
		return nil, &RPCError{Method: "channel.open", Err: context.Cause(ctx)}
	}
	ch, err := c.allocateChannel()
	if err != nil {
		return nil, err
	}
	// sent receives whether channel.open was written. An abandonment must know: for an id the
	// broker never heard of, a channel.close would be a connection error (the id is released
	// instead), while for one it did, the id must wait for a stand-in's close-ok.
	sent := make(chan error, 1)
	err = runBounded(ctx, "channel.open", ch.id, func() error {
		err := ch.send(&channelOpen{})
		sent <- err
		if err != nil {
			return err
		}
		return ch.await(&channelOpenOk{})
	}, func(error, <-chan struct{}) { go ch.abandonOpen(sent) })
	if err != nil {
		// An abandoned open (Closed) belongs to abandonOpen now; any other failure
		// releases the id here, as upstream's openChannel does.
		var re *RPCError
		if !errors.As(err, &re) || !re.Closed {
			c.releaseChannel(ch)
		}
		return nil, err
	}
	// The rest of upstream's openChannel: the channel is open, and recovery watches it.
	ch.lifeCycle.SetState(StateOpen, nil)
	if c.IsRecoveryEnabled() {
		ch.watchChannel()
	}
	return ch, nil
}

// abandonOpen gives up ch once channel.open was written, or releases it if that failed.
func (ch *Channel) abandonOpen(sent <-chan error) {
	if err := <-sent; err != nil {
		ch.connection.releaseChannel(ch)
		return
	}
	ch.abandonAfter("channel.open", nil)
}

// UpdateSecretWithContext is UpdateSecret, bounded by ctx. If ctx ends first, it returns an
// *RPCError and the connection closes with an *Error saying why (recovery starts where enabled).
func (c *Connection) UpdateSecretWithContext(ctx context.Context, newSecret, reason string) error {
	const method = "connection.update-secret"
	return runBounded(ctx, method, 0, func() error { return c.UpdateSecret(newSecret, reason) },
		func(cause error, _ <-chan struct{}) { c.abandonConnection(method, cause) })
}

// CloseWithContext is Close, bounded by ctx. If ctx ends (or has ended) before the broker's
// close-ok or before an in-flight recovery settles, it returns an *RPCError and closes the socket,
// which ends the connection at once and frees a publisher blocked in a write; the teardown finishes
// on its own, and the connection, its channels, consumers and listeners end up closed as with
// Close; an ended ctx on a closed one gets ErrClosed.
func (c *Connection) CloseWithContext(ctx context.Context) error {
	const method = "connection.close"
	if ctx == nil {
		return errNilContext
	}
	// An ended ctx still closes the connection (that is what the caller asked for), but
	// without waiting for anything: the socket first, so that Close's handshake fails at once.
	// A ctx whose Done is nil never ends: runBounded runs Close inline.
	if ctx.Err() != nil {
		if c.IsClosed() {
			return ErrClosed
		}
		go func() { c.closeSocket(); _ = c.Close() }()
		return &RPCError{Method: method, Err: context.Cause(ctx), Closed: true}
	}
	return runBounded(ctx, method, 0, c.Close,
		func(error, <-chan struct{}) { go c.closeSocket() })
}

// closeSocket closes the current socket: the reader fails, releasing every waiter. A read
// path fails its generation (rp.abandon), which closes the socket and says why; upstream mode
// closes c.conn, read under c.m as upstream's reader reads it.
func (c *Connection) closeSocket() {
	if c.rp != nil {
		c.rp.abandon(&Error{Code: InternalError,
			Reason: "connection.close got no reply in time: socket closed"})
		return
	}
	c.m.Lock()
	conn := c.conn
	c.m.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
}

// boundedValue is ch.bounded for a method that returns a value (zero with an error).
func boundedValue[T any](ctx context.Context, ch *Channel, method string,
	call func() (T, error)) (T, error) {
	var v T // the abandoned call's goroutine may still write it: read only on success
	err := ch.bounded(ctx, method, func() (err error) {
		v, err = call()
		return err
	})
	if err != nil {
		return *new(T), err
	}
	return v, nil
}
