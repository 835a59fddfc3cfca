// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// Unit tests of a budgeted consumer's inbox and its consumer loop with
// the Consume chan as handler (inbox.go, consumeloop.go): no broker, no
// socket.

// budgetedConsumers returns a channel's consumer registry with a budget,
// as a read path makes it, and that budget.
func budgetedConsumers() (*consumers, *budget, chan struct{}) {
	subs := makeConsumers()
	b := newBudget(1<<30, 1<<29)
	closing := make(chan struct{})
	subs.acct = &deliveryAcct{budget: b, buffers: &bufferSet{}, channel: 1, closing: closing}
	return subs, b, closing
}

func numbered(n int) []*Delivery {
	ds := make([]*Delivery, n)
	for i := range ds {
		ds[i] = &Delivery{DeliveryTag: uint64(i + 1), Body: make([]byte, 10)}
	}
	return ds
}

// queuedInStats returns what Stats would show of the registry's buffers.
func queuedInStats(subs *consumers) (n int, bytes int64) {
	for _, cs := range subs.acct.buffers.fill(nil, monoNow()) {
		n += cs.Queued
		bytes += cs.QueuedBytes
	}
	return n, bytes
}

// TestUnitInboxHandsOverInOrder pins that deliveries put while the
// application is not reading wait in the inbox, charged and visible to
// Stats, and reach the Consume chan in order, releasing their charge; the
// consumer's goroutine parks with nothing queued, and ends with the
// registry.
func TestUnitInboxHandsOverInOrder(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		subs, b, _ := budgetedConsumers()
		out := make(chan Delivery)
		subs.add("c", out, consumerConfig{})
		ds := numbered(50)
		for _, d := range ds {
			subs.deliver("c", d)
		}
		synctest.Wait()
		if n, bytes := queuedInStats(subs); n != 50 || bytes != 50*deliveryCost(ds[0]) {
			t.Errorf("Stats shows %d deliveries, %d B queued; want 50, %d", n, bytes, 50*deliveryCost(ds[0]))
		}
		if used := b.usedNow(); used != 50*deliveryCost(ds[0]) {
			t.Errorf("budget %d, want %d", used, 50*deliveryCost(ds[0]))
		}
		for i := range ds {
			if d := <-out; d.DeliveryTag != uint64(i+1) {
				t.Fatalf("delivery %d: tag %d", i+1, d.DeliveryTag)
			}
		}
		synctest.Wait()
		if used := b.usedNow(); used != 0 {
			t.Errorf("budget %d after every delivery was received", used)
		}
		if n, _ := queuedInStats(subs); n != 0 {
			t.Errorf("Stats shows %d queued after every delivery was received", n)
		}
		// A second burst after the goroutine parked on an empty inbox.
		for _, d := range numbered(3) {
			subs.deliver("c", d)
		}
		for i := 0; i < 3; i++ {
			<-out
		}
		subs.close()
		if _, ok := <-out; ok {
			t.Error("the Consume chan stayed open after the registry closed")
		}
	})
}

// TestUnitInboxCancelAndClose pins upstream's ends: a cancel hands over
// what was queued before it and then closes the chan; a channel's close
// drops what is queued; Close beginning (consumeloop.go) drops what is
// queued and what still arrives, and the chan closes at the teardown. In
// every case the budget ends at zero and a delivery for a tag no longer
// consumed is dropped uncharged.
func TestUnitInboxCancelAndClose(t *testing.T) {
	for _, end := range []string{"cancel", "channel close", "Close begun"} {
		t.Run(end, func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				subs, b, closing := budgetedConsumers()
				out := make(chan Delivery)
				subs.add("c", out, consumerConfig{})
				for _, d := range numbered(5) {
					subs.deliver("c", d)
				}
				var got []uint64
				switch end {
				case "cancel":
					subs.cancel("c")
					for d := range out {
						got = append(got, d.DeliveryTag)
					}
					if fmt.Sprint(got) != "[1 2 3 4 5]" {
						t.Errorf("after the cancel the chan gave %v, want [1 2 3 4 5]", got)
					}
					subs.deliver("c", numbered(1)[0])
					subs.close()
				case "channel close":
					subs.close()
					for d := range out {
						got = append(got, d.DeliveryTag)
					}
					if len(got) > 0 {
						t.Errorf("after the channel's close the chan gave %v", got)
					}
				case "Close begun":
					close(closing)
					synctest.Wait()
					subs.deliver("c", numbered(1)[0])
					synctest.Wait()
					select {
					case d := <-out:
						t.Errorf("delivery %d handed over after Close began", d.DeliveryTag)
					default:
					}
					if used := b.usedNow(); used != 0 {
						t.Errorf("budget %d once Close began", used)
					}
					subs.close()
					for range out {
						t.Error("a delivery at the teardown")
					}
				}
				synctest.Wait()
				if used := b.usedNow(); used != 0 {
					t.Errorf("budget %d at the end", used)
				}
				if n, _ := queuedInStats(subs); n != 0 {
					t.Errorf("Stats shows %d queued at the end", n)
				}
			})
		})
	}
}

// TestUnitInboxDirectHandOverKeepsOrder pins the direct hand-over: a
// delivery goes straight to an application waiting on its Consume chan
// only when nothing is queued before it. A reader that now keeps up and
// now falls behind, against a producer that now bursts and now pauses,
// gets every delivery once, in order, and the budget ends at zero.
func TestUnitInboxDirectHandOverKeepsOrder(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		subs, b, _ := budgetedConsumers()
		out := make(chan Delivery)
		subs.add("c", out, consumerConfig{})
		const n = 2000
		got := make(chan []uint64)
		all := make(chan struct{}) // closed when the reader has n
		go func() {
			var tags []uint64
			for d := range out {
				tags = append(tags, d.DeliveryTag)
				if len(tags) == n {
					close(all)
				}
				if len(tags)%7 == 0 {
					time.Sleep(time.Millisecond) // falls behind
				}
			}
			got <- tags
		}()
		direct := 0
		for i, d := range numbered(n) {
			box := subs.acct.inboxOf(subs.chans["c"], "c")
			if !box.put(d, deliveryCost(d), b) {
				direct++
			}
			if i%11 == 0 {
				time.Sleep(2 * time.Millisecond) // the reader catches up
			}
		}
		<-all
		synctest.Wait() // the buffer goroutine has released the last one
		if used := b.usedNow(); used != 0 {
			t.Errorf("budget %d once everything was received", used)
		}
		subs.close()
		tags := <-got
		if len(tags) != n {
			t.Fatalf("received %d of %d", len(tags), n)
		}
		for i, tag := range tags {
			if tag != uint64(i+1) {
				t.Fatalf("delivery %d: tag %d", i+1, tag)
			}
		}
		if direct == 0 || direct == n {
			t.Errorf("%d of %d handed over directly: the test exercised only one path", direct, n)
		}
	})
}

// TestUnitInboxTakeKeepsOrderAndStats pins take, the consumer loop's way
// out of the inbox (consumeloop.go): deliveries leave in order, Stats follows,
// and an empty inbox parks the taker, so the next put asks for a wake-up.
func TestUnitInboxTakeKeepsOrderAndStats(t *testing.T) {
	st := &bufferStat{}
	box := &inbox{st: st, wake: make(chan struct{}, 1)}
	b := newBudget(1<<30, 1<<29)
	ds := numbered(4)
	for _, d := range ds {
		box.put(d, deliveryCost(d), b)
	}
	if got := st.queued.Load(); got != 4 {
		t.Fatalf("Stats shows %d queued, want 4", got)
	}
	for i := range ds {
		it, ok := box.take()
		if !ok || it.d.DeliveryTag != uint64(i+1) || it.cost != deliveryCost(ds[i]) {
			t.Fatalf("take %d: %v, tag %d, cost %d", i+1, ok, it.d.DeliveryTag, it.cost)
		}
		b.release(it.cost)
	}
	if _, ok := box.take(); ok {
		t.Fatal("take from an empty inbox reported a delivery")
	}
	if got, bytes := st.queued.Load(), st.bytes.Load(); got != 0 || bytes != 0 {
		t.Fatalf("Stats shows %d queued, %d B, after every take", got, bytes)
	}
	<-box.wake // the first put found the taker parked (never taken before)
	box.put(ds[0], deliveryCost(ds[0]), b)
	select {
	case <-box.wake:
	default:
		t.Fatal("a put after take found the inbox empty did not wake the taker")
	}
}
