// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"sync"
	"testing"
	"time"
)

// Unit tests of the outbox (outbox.go): no broker, no socket.

type testOwner struct {
	notifyM  sync.RWMutex
	noNotify bool
}

func newTestOutbox(owner *testOwner, closeWait time.Duration) (*outbox, *budget, *workCount) {
	b := newBudget(1<<20, 1<<19)
	w := &workCount{}
	return &outbox{lock: &owner.notifyM, closed: &owner.noNotify, workQueue: workQueue[queuedItem]{budget: b, work: w}, closeWait: closeWait}, b, w
}

func intCost(int) int64        { return 1 }
func stringCost1(string) int64 { return 1 }

// An unread listener holds back the later notifications of its owner, of
// every kind, and they are handed over in arrival order once it is read.
func TestOutboxKeepsArrivalOrderAcrossListeners(t *testing.T) {
	var owner testOwner
	o, b, w := newTestOutbox(&owner, time.Minute)
	returns := make(chan string) // unbuffered, not read yet
	acks := make(chan int, 100)  // room for everything
	o.queue(action(func() {}))   // something in flight: no inline hand-over
	notifyAllInOrder(o, []chan string{returns}, stringCost1, "return 1")
	notifyAllInOrder(o, []chan int{acks}, intCost, 1)
	notifyAllInOrder(o, []chan string{returns}, stringCost1, "return 2")
	notifyAllInOrder(o, []chan int{acks}, intCost, 2)

	select {
	case a := <-acks:
		t.Fatalf("ack %d handed over before the return queued ahead of it", a)
	case <-time.After(20 * time.Millisecond): // a window for a wrong hand-over, not synchronisation
	}
	if got := <-returns; got != "return 1" {
		t.Fatalf("first return = %q", got)
	}
	if got := <-acks; got != 1 {
		t.Fatalf("first ack = %d", got)
	}
	if got := <-returns; got != "return 2" {
		t.Fatalf("second return = %q", got)
	}
	if got := <-acks; got != 2 {
		t.Fatalf("second ack = %d", got)
	}
	if !w.waitIdle(time.Now().Add(5 * time.Second)) {
		t.Fatal("outbox did not empty")
	}
	if used, _ := budgetUsed(b); used != 0 {
		t.Fatalf("budget still charged %d bytes", used)
	}
}

// With nothing queued and room in every listener, a notification is handed
// over by its producer: no goroutine, nothing charged.
func TestOutboxHandsOverInlineWhenIdle(t *testing.T) {
	var owner testOwner
	o, _, w := newTestOutbox(&owner, time.Minute)
	acks := make(chan int, 2)
	notifyAllInOrder(o, []chan int{acks}, intCost, 1, 2)
	if len(acks) != 2 || !o.idle() || w.n.Load() != 0 {
		t.Fatalf("inline hand-over: %d in chan, idle %v, work %d", len(acks), o.idle(), w.n.Load())
	}
	// The third does not fit: it waits in the outbox, and an action after
	// it waits too.
	notifyAllInOrder(o, []chan int{acks}, intCost, 3)
	ran := make(chan struct{})
	o.inOrder(func() { close(ran) })
	select {
	case <-ran:
		t.Fatal("action ran before the notification queued ahead of it")
	default:
	}
	<-acks
	<-acks
	if got := <-acks; got != 3 {
		t.Fatalf("third = %d", got)
	}
	<-ran
}

// A close waits for the notifications before it at most closeWait; then
// they are dropped, while settlements still settle.
func TestOutboxCloseDropsWhatAnUnreadListenerHolds(t *testing.T) {
	var owner testOwner
	o, b, w := newTestOutbox(&owner, 30*time.Millisecond)
	unread := make(chan int)
	notifyAllInOrder(o, []chan int{unread}, intCost, 1, 2, 3)
	dc := &DeferredConfirmation{DeliveryTag: 1, done: make(chan struct{})}
	o.queue(&settlement{dcs: []*DeferredConfirmation{dc}, ack: true})
	closed := make(chan time.Time)
	start := time.Now()
	o.closeInOrder(func() { closed <- time.Now() })
	select {
	case at := <-closed:
		if waited := at.Sub(start); waited < 30*time.Millisecond {
			t.Fatalf("close ran after %s, before closeWait", waited)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("close still waiting after 10s")
	}
	if !dc.Acked() {
		t.Fatal("a dropped settlement left its DeferredConfirmation unsettled")
	}
	if !w.waitIdle(time.Now().Add(5 * time.Second)) {
		t.Fatal("outbox did not empty")
	}
	if used, _ := budgetUsed(b); used != 0 {
		t.Fatalf("budget still charged %d bytes", used)
	}
}

// Once the owner closed its listeners (noNotify), what is queued for them is
// dropped at once.
func TestOutboxDropsForClosedListeners(t *testing.T) {
	var owner testOwner
	o, _, w := newTestOutbox(&owner, time.Hour)
	unread := make(chan int)
	notifyAllInOrder(o, []chan int{unread}, intCost, 1, 2, 3)
	owner.notifyM.Lock()
	owner.noNotify = true
	owner.notifyM.Unlock()
	if !w.waitIdle(time.Now().Add(5 * time.Second)) {
		t.Fatal("outbox kept notifications for closed listeners")
	}
}

func TestWorkCountWaitIdle(t *testing.T) {
	var w workCount
	if !w.waitIdle(time.Now()) {
		t.Fatal("idle count not idle")
	}
	w.add(2)
	if w.waitIdle(time.Now().Add(10 * time.Millisecond)) {
		t.Fatal("busy count reported idle")
	}
	go func() {
		w.add(-1)
		w.add(-1)
	}()
	if !w.waitIdle(time.Now().Add(10 * time.Second)) {
		t.Fatal("count did not become idle")
	}
}

func budgetUsed(b *budget) (used, pinned int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.pinned
}
