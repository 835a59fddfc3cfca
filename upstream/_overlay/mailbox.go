// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"sync"
	"time"
)

// Mailbox send slices. A blocked delivery holds the listener's notify lock
// (read side) for at most one slice, then lets go and tries again. The lock
// is what makes a send race-free against upstream closing the listener
// chan, and the slice bound is what keeps anyone who takes that lock for
// writing (Notify* registration, Close, shutdown) from waiting on a user who
// does not read: they wait at most mailboxMaxSlice.
const (
	mailboxMinSlice = time.Millisecond
	mailboxMaxSlice = 50 * time.Millisecond
)

// mailbox delivers values to one user listener chan, in order, from its own
// short-lived goroutine, so that whoever produces the values never waits for
// the user. Nothing is dropped while the listener is open: values queue
// (charged to the connection's budget) until the user reads them. Once
// upstream has closed the listener (its owner's noNotify is set), queued
// values are discarded, as upstream discards notifications after close.
type mailbox[T any] struct {
	out    chan T
	lock   *sync.RWMutex // the owner's notifyM, held by upstream while it closes out
	closed *bool         // the owner's noNotify, guarded by lock
	budget *budget
	cost   func(T) int64

	mu      sync.Mutex
	queue   []T
	running bool
	owner   *mailboxes
}

// push queues values and starts a deliverer if none is running.
func (mb *mailbox[T]) push(vs ...T) {
	if len(vs) == 0 {
		return
	}
	var cost int64
	for _, v := range vs {
		cost += mb.cost(v)
	}
	mb.budget.charge(cost)
	mb.mu.Lock()
	mb.queue = append(mb.queue, vs...)
	start := !mb.running
	mb.running = true
	mb.mu.Unlock()
	if start {
		mb.owner.wg.Add(1)
		go mb.deliver()
	}
}

func (mb *mailbox[T]) deliver() {
	defer mb.owner.wg.Done()
	slice := mailboxMinSlice
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		mb.mu.Lock()
		if len(mb.queue) == 0 {
			mb.running = false
			mb.mu.Unlock()
			return
		}
		v := mb.queue[0]
		mb.mu.Unlock()

		sent, gone := mb.trySend(v, slice, &timer)
		switch {
		case gone:
			mb.discard()
			mb.owner.forget(mb.out)
			return
		case sent:
			mb.mu.Lock()
			var zero T
			mb.queue[0] = zero
			mb.queue = mb.queue[1:]
			mb.mu.Unlock()
			mb.budget.release(mb.cost(v))
			slice = mailboxMinSlice
		default:
			if slice *= 2; slice > mailboxMaxSlice {
				slice = mailboxMaxSlice
			}
		}
	}
}

// trySend offers v to the listener for up to slice, under the read lock.
func (mb *mailbox[T]) trySend(v T, slice time.Duration, timer **time.Timer) (sent, gone bool) {
	mb.lock.RLock()
	defer mb.lock.RUnlock()
	if *mb.closed {
		return false, true
	}
	select {
	case mb.out <- v:
		return true, false
	default:
	}
	if *timer == nil {
		*timer = time.NewTimer(slice)
	} else {
		(*timer).Reset(slice)
	}
	select {
	case mb.out <- v:
		if !(*timer).Stop() {
			<-(*timer).C
		}
		return true, false
	case <-(*timer).C:
		return false, false
	}
}

// discard drops what is queued for a listener that upstream has closed.
func (mb *mailbox[T]) discard() {
	mb.mu.Lock()
	var cost int64
	for _, v := range mb.queue {
		cost += mb.cost(v)
	}
	mb.queue = nil
	mb.running = false
	mb.mu.Unlock()
	mb.budget.release(cost)
}

// mailboxes finds the mailbox of each listener chan, creating it on first
// use. Listener chans are comparable, so the chan itself is the key.
type mailboxes struct {
	mu  sync.Mutex
	all map[any]any
	wg  sync.WaitGroup
}

func mailboxFor[T any](mbs *mailboxes, out chan T, lock *sync.RWMutex, closed *bool, b *budget, cost func(T) int64) *mailbox[T] {
	mbs.mu.Lock()
	defer mbs.mu.Unlock()
	if mbs.all == nil {
		mbs.all = map[any]any{}
	}
	if mb, ok := mbs.all[out]; ok {
		return mb.(*mailbox[T])
	}
	mb := &mailbox[T]{out: out, lock: lock, closed: closed, budget: b, cost: cost, owner: mbs}
	mbs.all[out] = mb
	return mb
}

// forget drops the mailbox of a listener that upstream has closed.
func (mbs *mailboxes) forget(out any) {
	mbs.mu.Lock()
	delete(mbs.all, out)
	mbs.mu.Unlock()
}

// notifyEach queues v for every listener in ls.
func notifyEach[T any](mbs *mailboxes, ls []chan T, lock *sync.RWMutex, closed *bool, b *budget, cost func(T) int64, vs ...T) {
	for _, l := range ls {
		mailboxFor(mbs, l, lock, closed, b, cost).push(vs...)
	}
}
