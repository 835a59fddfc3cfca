// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"testing"
	"testing/synctest"
	"time"
)

// The read turn's lending protocol (readturn.go), in a synctest bubble. Each time.Sleep
// below is part of a scenario, not a wait for another goroutine: on the bubble's fake
// clock it is a lessee that holds the turn for that long (a handler running), and the
// test asserts the exact time at which the holder took the turn back. The goroutines
// synchronise through the turn's chans and synctest.Wait. The holder parks
// in lend, a lessee takes the turn through offer's slot, and the holder takes it back
// when the lessee gives it back, when its timer finds no lessee read for leaseCheck, or
// never, once the generation ended.

// lendOutcome is what lend returned, and when.
type lendOutcome struct {
	held, stop bool
	err        *Error
	after      time.Duration
}

// startLending makes t's holder take the turn and lend it; the outcome arrives on the chan.
func startLending(t *readTurn, dead chan struct{}) <-chan lendOutcome {
	t.take()
	out := make(chan lendOutcome, 1)
	begin := time.Now()
	go func() {
		held, stop, err := t.lend(dead)
		out <- lendOutcome{held, stop, err, time.Since(begin)}
	}()
	return out
}

func TestUnitReadTurnGivenBack(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		turn := newReadTurn()
		dead := make(chan struct{})
		slot := turn.offer()
		out := startLending(&turn, dead)
		slot <- struct{}{}               // the lessee has the turn once the holder let it go
		time.Sleep(3 * time.Millisecond) // the lessee reads for 3 ms, before the 10 ms timer
		turn.readEnded()
		turn.release()
		turn.giveBack()
		got := <-out
		if !got.held || got.stop || got.err != nil {
			t.Fatalf("lend = held %v, stop %v, err %v; want the turn held, no stop", got.held, got.stop, got.err)
		}
		if got.after != 3*time.Millisecond {
			t.Errorf("the holder took its turn back after %s, want 3ms (the give-back)", got.after)
		}
		if !turn.busy() {
			t.Error("the holder does not hold the turn after lend")
		}
		if turn.lent.Load() {
			t.Error("lent still set after lend returned")
		}
	})
}

func TestUnitReadTurnTakenBackAfterQuiet(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		turn := newReadTurn()
		dead := make(chan struct{})
		slot := turn.offer()
		out := startLending(&turn, dead)
		// A handler that runs long: the lessee holds the turn 25 ms, then lets it go
		// without a give-back. The timer finds a read under way at 10 and 20 ms, and at
		// 30 ms the token free with no read ended for leaseCheck.
		slot <- struct{}{}
		time.Sleep(25 * time.Millisecond)
		turn.release()
		got := <-out
		if !got.held || got.stop {
			t.Fatalf("lend = held %v, stop %v; want the turn held", got.held, got.stop)
		}
		if got.after != 30*time.Millisecond {
			t.Errorf("the holder took its turn back after %s, want 30ms", got.after)
		}
	})
}

func TestUnitReadTurnLesseeStopped(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		turn := newReadTurn()
		slot := turn.offer()
		out := startLending(&turn, make(chan struct{}))
		slot <- struct{}{}
		why := &Error{Code: FrameError, Reason: "a lessee's read failed"}
		turn.stopped = true // as lesseeRead does, the turn held
		turn.stopErr = why
		turn.release()
		turn.giveBack()
		got := <-out
		if !got.held || !got.stop || got.err != why {
			t.Fatalf("lend = held %v, stop %v, err %v; want held, stopped with the lessee's error",
				got.held, got.stop, got.err)
		}
	})
}

func TestUnitReadTurnEndedWhileLent(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		turn := newReadTurn()
		dead := make(chan struct{})
		slot := turn.offer()
		out := startLending(&turn, dead)
		slot <- struct{}{} // a lessee holds the turn, and keeps it
		close(dead)
		got := <-out
		if got.held || !got.stop {
			t.Fatalf("lend = held %v, stop %v; want not held (a lessee has it), stop", got.held, got.stop)
		}
		turn.release()
	})
}

func TestUnitReadTurnReclaim(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		turn := newReadTurn()
		turn.reclaim() // nothing lent: no give-back may be left behind for a later lend
		if len(turn.back) != 0 {
			t.Fatal("reclaim with nothing lent left a give-back")
		}
		out := startLending(&turn, make(chan struct{}))
		synctest.Wait() // the holder is parked in lend
		turn.reclaim()
		if got := <-out; !got.held || got.after != 0 {
			t.Fatalf("lend = held %v after %s; want the turn back at once", got.held, got.after)
		}
	})
}

// TestUnitHeartbeatClock pins the heartbeat arithmetic (readstep.go) at a 1 s interval
// (a 2 s heartbeat): death after 3 intervals of silence, a duty every 1.5 intervals at
// the most, and a frame that carries the duty once half an interval has passed.
func TestUnitHeartbeatClock(t *testing.T) {
	hb := heartbeatClock{time.Second}
	at := time.Unix(1000, 0)
	if err := hb.timeout(at, at.Add(2999*time.Millisecond)); err != nil {
		t.Errorf("timeout at 2.999s of silence: %v, want none", err)
	}
	if err := hb.timeout(at, at.Add(3*time.Second)); err == nil || err.Code != FrameError {
		t.Errorf("timeout at 3s of silence = %v, want a FrameError", err)
	}
	if err := (heartbeatClock{}).timeout(at, at.Add(time.Hour)); err != nil {
		t.Errorf("timeout with no heartbeats: %v, want none", err)
	}
	if got := hb.readDeadline(at, at); !got.Equal(at.Add(1500 * time.Millisecond)) {
		t.Errorf("readDeadline right after a duty = %s, want the next duty at 1.5s", got.Sub(at))
	}
	if got := hb.readDeadline(at, at.Add(2*time.Second)); !got.Equal(at.Add(3 * time.Second)) {
		t.Errorf("readDeadline after a late duty = %s, want the broker's death at 3s", got.Sub(at))
	}
	if hb.dutyDue(at, at.Add(1499*time.Millisecond)) || !hb.dutyDue(at, at.Add(1500*time.Millisecond)) {
		t.Error("dutyDue: want the duty owed from 1.5s after the last")
	}
	if hb.piggyback(time.Time{}, at) {
		t.Error("piggyback before any duty: want none (the first step starts the clock)")
	}
	if hb.piggyback(at, at.Add(499*time.Millisecond)) || !hb.piggyback(at, at.Add(500*time.Millisecond)) {
		t.Error("piggyback: want a frame to carry the duty from half an interval on")
	}
}
