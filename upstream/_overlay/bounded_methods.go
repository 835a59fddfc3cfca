// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"context"
	"errors"
)

// The context variants of the synchronous methods (bounded.go has the
// mechanism; RPCError says what a ctx that ends first brings about). Each
// of Channel's, CloseWithContext aside, runs the upstream method of the
// same name, so it records topology for recovery, validates its arguments
// and behaves in every other way as that method does; only the wait is
// bounded by ctx. A ctx whose Done is nil (context.Background()) runs the
// upstream method on the caller's goroutine, at exactly its cost.

// QosWithContext is Qos, bounded by ctx (see RPCError).
func (ch *Channel) QosWithContext(ctx context.Context, prefetchCount, prefetchSize int, global bool) error {
	return ch.bounded(ctx, "basic.qos", func() error { return ch.Qos(prefetchCount, prefetchSize, global) })
}

// CancelWithContext is Cancel, bounded by ctx (see RPCError).
func (ch *Channel) CancelWithContext(ctx context.Context, consumer string, noWait bool) error {
	return ch.bounded(ctx, "basic.cancel", func() error { return ch.Cancel(consumer, noWait) })
}

// QueueDeclareWithContext is QueueDeclare, bounded by ctx (see RPCError).
func (ch *Channel) QueueDeclareWithContext(ctx context.Context, name string, durable, autoDelete, exclusive, noWait bool, args Table) (Queue, error) {
	return boundedValue(ctx, ch, "queue.declare", func() (Queue, error) { return ch.QueueDeclare(name, durable, autoDelete, exclusive, noWait, args) })
}

// QueueDeclarePassiveWithContext is QueueDeclarePassive, bounded by ctx (see RPCError).
func (ch *Channel) QueueDeclarePassiveWithContext(ctx context.Context, name string, durable, autoDelete, exclusive, noWait bool, args Table) (Queue, error) {
	return boundedValue(ctx, ch, "queue.declare", func() (Queue, error) {
		return ch.QueueDeclarePassive(name, durable, autoDelete, exclusive, noWait, args)
	})
}

// QueueBindWithContext is QueueBind, bounded by ctx (see RPCError).
func (ch *Channel) QueueBindWithContext(ctx context.Context, name, key, exchange string, noWait bool, args Table) error {
	return ch.bounded(ctx, "queue.bind", func() error { return ch.QueueBind(name, key, exchange, noWait, args) })
}

// QueueUnbindWithContext is QueueUnbind, bounded by ctx (see RPCError).
func (ch *Channel) QueueUnbindWithContext(ctx context.Context, name, key, exchange string, args Table) error {
	return ch.bounded(ctx, "queue.unbind", func() error { return ch.QueueUnbind(name, key, exchange, args) })
}

// QueuePurgeWithContext is QueuePurge, bounded by ctx (see RPCError).
func (ch *Channel) QueuePurgeWithContext(ctx context.Context, name string, noWait bool) (int, error) {
	return boundedValue(ctx, ch, "queue.purge", func() (int, error) { return ch.QueuePurge(name, noWait) })
}

// QueueDeleteWithContext is QueueDelete, bounded by ctx (see RPCError).
func (ch *Channel) QueueDeleteWithContext(ctx context.Context, name string, ifUnused, ifEmpty, noWait bool) (int, error) {
	return boundedValue(ctx, ch, "queue.delete", func() (int, error) { return ch.QueueDelete(name, ifUnused, ifEmpty, noWait) })
}

// ExchangeDeclareWithContext is ExchangeDeclare, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeDeclareWithContext(ctx context.Context, name, kind string, durable, autoDelete, internal, noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.declare", func() error { return ch.ExchangeDeclare(name, kind, durable, autoDelete, internal, noWait, args) })
}

// ExchangeDeclarePassiveWithContext is ExchangeDeclarePassive, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeDeclarePassiveWithContext(ctx context.Context, name, kind string, durable, autoDelete, internal, noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.declare", func() error {
		return ch.ExchangeDeclarePassive(name, kind, durable, autoDelete, internal, noWait, args)
	})
}

// ExchangeDeleteWithContext is ExchangeDelete, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeDeleteWithContext(ctx context.Context, name string, ifUnused, noWait bool) error {
	return ch.bounded(ctx, "exchange.delete", func() error { return ch.ExchangeDelete(name, ifUnused, noWait) })
}

// ExchangeBindWithContext is ExchangeBind, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeBindWithContext(ctx context.Context, destination, key, source string, noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.bind", func() error { return ch.ExchangeBind(destination, key, source, noWait, args) })
}

// ExchangeUnbindWithContext is ExchangeUnbind, bounded by ctx (see RPCError).
func (ch *Channel) ExchangeUnbindWithContext(ctx context.Context, destination, key, source string, noWait bool, args Table) error {
	return ch.bounded(ctx, "exchange.unbind", func() error { return ch.ExchangeUnbind(destination, key, source, noWait, args) })
}

// GetWithContext is Get, bounded by ctx (see RPCError).
func (ch *Channel) GetWithContext(ctx context.Context, queue string, autoAck bool) (Delivery, bool, error) {
	var r0 Delivery
	var r1 bool
	err := ch.bounded(ctx, "basic.get", func() (err error) {
		r0, r1, err = ch.Get(queue, autoAck)
		return err
	})
	if err != nil {
		return Delivery{}, false, err
	}
	return r0, r1, nil
}

// TxWithContext is Tx, bounded by ctx (see RPCError).
func (ch *Channel) TxWithContext(ctx context.Context) error {
	return ch.bounded(ctx, "tx.select", func() error { return ch.Tx() })
}

// TxCommitWithContext is TxCommit, bounded by ctx (see RPCError).
func (ch *Channel) TxCommitWithContext(ctx context.Context) error {
	return ch.bounded(ctx, "tx.commit", func() error { return ch.TxCommit() })
}

// TxRollbackWithContext is TxRollback, bounded by ctx (see RPCError).
func (ch *Channel) TxRollbackWithContext(ctx context.Context) error {
	return ch.bounded(ctx, "tx.rollback", func() error { return ch.TxRollback() })
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

// ConsumeWithRPCContext is Consume, with the basic.consume round trip
// bounded by ctx (see RPCError). Once it has returned, ctx has no effect:
// the consumer lives until it is cancelled or the channel closes.
// Upstream's ConsumeWithContext is another thing: its ctx cancels the
// consumer when it ends, and does not bound the round trip.
func (ch *Channel) ConsumeWithRPCContext(ctx context.Context, queue, consumer string, autoAck, exclusive, noLocal, noWait bool, args Table) (<-chan Delivery, error) {
	var deliveries <-chan Delivery
	err := ch.bounded(ctx, "basic.consume", func() (err error) {
		deliveries, err = ch.Consume(queue, consumer, autoAck, exclusive, noLocal, noWait, args)
		return err
	})
	if err != nil {
		return nil, err
	}
	return deliveries, nil
}

// CloseWithContext is Close, bounded by ctx. The channel is closed for
// the application at once, whenever ctx ends: deliveries, listeners and
// waiters are closed as Close closes them, and nothing more is sent on it.
// It returns nil, or the error of the close handshake, once the broker has
// answered channel.close; if ctx ends first, an *RPCError (see RPCError),
// while the channel's id stays reserved until the broker answers or the
// connection ends. As Close, it returns nil for a channel that is already
// closed.
func (ch *Channel) CloseWithContext(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	if ctx.Done() == nil {
		return ch.Close()
	}
	stand := ch.takeOver()
	if stand == nil {
		return nil // closed or closing already, as Close finds it
	}
	sent := make(chan error, 1)
	go func() { sent <- ch.retire(stand, "kthxbai", nil) }()
	giveUp := func() error {
		go func() { stand.closeInBackground(<-sent) }()
		return &RPCError{Method: "channel.close", Channel: ch.id, Err: context.Cause(ctx), Closed: true}
	}
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
	ch.connection.dropStandIn(stand)
	return err
}

// ChannelWithContext is Channel, with the channel.open round trip bounded
// by ctx. If ctx ends first it returns an *RPCError (see RPCError); the
// channel id it had taken stays reserved until the broker has answered the
// open and the channel.close that follows it, so a late channel.open-ok is
// never taken for another channel's reply.
func (c *Connection) ChannelWithContext(ctx context.Context) (*Channel, error) {
	if ctx == nil {
		return nil, errNilContext
	}
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
	// sent says whether channel.open reached the socket: if it did not,
	// the broker knows nothing of the id, and a channel.close for it would
	// be a connection error.
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
		var re *RPCError
		if !errors.As(err, &re) || !re.Closed {
			c.releaseChannel(ch) // as upstream's openChannel
		}
		return nil, err
	}
	ch.lifeCycle.SetState(StateOpen, nil)
	if c.IsRecoveryEnabled() {
		ch.watchChannel()
	}
	return ch, nil
}

// abandonOpen gives up a channel whose open got no reply in time, once
// channel.open has been written (or has failed to be).
func (ch *Channel) abandonOpen(sent <-chan error) {
	if err := <-sent; err != nil {
		ch.connection.releaseChannel(ch)
		return
	}
	ch.abandon("channel.open")
}

// UpdateSecretWithContext is UpdateSecret, bounded by ctx. A
// connection-level request that gets no reply cannot be given up alone:
// if ctx ends first, the connection is closed with an *Error saying why
// (which starts automatic recovery where it is enabled), and it returns an
// *RPCError (see RPCError).
func (c *Connection) UpdateSecretWithContext(ctx context.Context, newSecret, reason string) error {
	const method = "connection.update-secret"
	return runBounded(ctx, method, 0, func() error { return c.UpdateSecret(newSecret, reason) },
		func(cause error, _ <-chan struct{}) { c.abandonConnection(method, cause) })
}

// CloseWithContext is Close, bounded by ctx. If ctx ends before the
// broker's close-ok (or before an in-flight recovery settles, which Close
// waits for), the socket is closed, which ends the connection at once and
// frees a publisher blocked in a write, and it returns an *RPCError (see
// RPCError); the rest of the teardown finishes on its own. A ctx that has
// already ended closes the socket without waiting for the broker. Close's other guarantees hold: afterwards the
// connection, its channels, consumers and listeners are closed.
func (c *Connection) CloseWithContext(ctx context.Context) error {
	const method = "connection.close"
	if ctx == nil {
		return errNilContext
	}
	if ctx.Done() == nil {
		return c.Close()
	}
	if ctx.Err() != nil {
		if c.IsClosed() {
			return ErrClosed
		}
		go func() {
			c.closeSocket()
			_ = c.Close()
		}()
		return &RPCError{Method: method, Err: context.Cause(ctx), Closed: true}
	}
	return runBounded(ctx, method, 0, c.Close, func(error, <-chan struct{}) { go c.closeSocket() })
}

// closeSocket closes the current generation's socket: the reader fails,
// and everything waiting on the connection is released with the error.
func (c *Connection) closeSocket() {
	if c.rp != nil {
		c.rp.abandon(&Error{Code: InternalError, Reason: "connection.close got no reply in time: socket closed"})
		return
	}
	c.m.Lock()
	conn := c.conn
	c.m.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
}

// boundedValue is ch.bounded for a method that returns a value: the value
// when the call returned, the zero value with the error otherwise.
func boundedValue[T any](ctx context.Context, ch *Channel, method string, call func() (T, error)) (T, error) {
	var v T
	err := ch.bounded(ctx, method, func() (err error) {
		v, err = call()
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}
