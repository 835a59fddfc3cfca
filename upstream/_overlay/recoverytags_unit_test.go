// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"testing"
)

// Unit tests of unique delivery tags (recoverytags.go): no broker, no
// socket. The broker-facing scenario is reliability/brokerfaults'
// TestStaleAckAfterRecovery.

// taggedChannel is channel 1 of a connection with unique tags, with the
// broker's tags 1 to n handed out in its first generation.
func taggedChannel(t *testing.T, n uint64) *Channel {
	t.Helper()
	ch := &Channel{id: 1, connection: &Connection{Config: Config{SafeRecovery: true}}}
	for raw := uint64(1); raw <= n; raw++ {
		if got := ch.tagged(&Delivery{DeliveryTag: raw}).DeliveryTag; got != raw {
			t.Fatalf("first generation: broker's tag %d handed out as %d, want it unchanged", raw, got)
		}
	}
	return ch
}

func TestTagsGrowAcrossGenerations(t *testing.T) {
	ch := taggedChannel(t, 5)
	ch.nextGeneration()
	for raw := uint64(1); raw <= 3; raw++ {
		if got := ch.tagged(&Delivery{DeliveryTag: raw}).DeliveryTag; got != 5+raw {
			t.Fatalf("second generation: broker's tag %d handed out as %d, want %d", raw, got, 5+raw)
		}
	}
	// A generation that hands nothing out adds nothing to the offset.
	ch.nextGeneration()
	ch.nextGeneration()
	if got := ch.tagged(&Delivery{DeliveryTag: 1}).DeliveryTag; got != 9 {
		t.Fatalf("fourth generation: broker's tag 1 handed out as %d, want 9", got)
	}
}

func TestSettleTranslatesThisGenerationsTags(t *testing.T) {
	ch := taggedChannel(t, 5)
	ch.nextGeneration()
	ch.tagged(&Delivery{DeliveryTag: 1}) // 6
	ch.tagged(&Delivery{DeliveryTag: 2}) // 7

	for _, tc := range []struct {
		msg  message
		want uint64
	}{
		{&basicAck{DeliveryTag: 6}, 1},
		{&basicAck{DeliveryTag: 7, Multiple: true}, 2}, // the broker's multiple stays in its generation
		{&basicNack{DeliveryTag: 7, Requeue: true}, 2},
		{&basicReject{DeliveryTag: 6}, 1},
		{&basicAck{DeliveryTag: 0, Multiple: true}, 0}, // everything outstanding: this generation's only
	} {
		if err := ch.settleTag(tc.msg); err != nil {
			t.Fatalf("%#v: %v", tc.msg, err)
		}
		var got uint64
		switch m := tc.msg.(type) {
		case *basicAck:
			got = m.DeliveryTag
		case *basicNack:
			got = m.DeliveryTag
		case *basicReject:
			got = m.DeliveryTag
		}
		if got != tc.want {
			t.Errorf("%T sent with the broker's tag %d, want %d", tc.msg, got, tc.want)
		}
	}
	// Other methods pass unchanged.
	if err := ch.settleTag(&basicQos{PrefetchCount: 1}); err != nil {
		t.Fatal(err)
	}
}

func TestSettleRefusesStaleAndUnknownTags(t *testing.T) {
	ch := taggedChannel(t, 5)
	ch.nextGeneration()
	ch.tagged(&Delivery{DeliveryTag: 1}) // 6

	for _, msg := range []message{
		&basicAck{DeliveryTag: 2},
		&basicAck{DeliveryTag: 5, Multiple: true},
		&basicNack{DeliveryTag: 1, Multiple: true, Requeue: true},
		&basicReject{DeliveryTag: 3},
	} {
		err := ch.settleTag(msg)
		if !errors.Is(err, ErrStaleDelivery) || !errors.Is(err, ErrClosed) {
			t.Fatalf("%#v: %v, want ErrStaleDelivery wrapping ErrClosed", msg, err)
		}
		var amqpErr *Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != ChannelError {
			t.Errorf("%#v: errors.As to *Error gives %v, want ErrClosed's", msg, amqpErr)
		}
	}
	err := ch.settleTag(&basicAck{DeliveryTag: 7})
	if !errors.Is(err, ErrUnknownDeliveryTag) || errors.Is(err, ErrClosed) {
		t.Fatalf("ack of a tag never handed out: %v, want ErrUnknownDeliveryTag, not ErrClosed", err)
	}
	if s, u := ch.connection.recovery.stale.Load(), ch.connection.recovery.unknown.Load(); s != 4 || u != 1 {
		t.Errorf("refused: %d stale, %d unknown; want 4 and 1", s, u)
	}
}

func TestUpstreamTagsWithoutOptIn(t *testing.T) {
	ch := &Channel{id: 1, connection: &Connection{}}
	ch.tagged(&Delivery{DeliveryTag: 5})
	ch.nextGeneration()
	if got := ch.tagged(&Delivery{DeliveryTag: 1}).DeliveryTag; got != 1 {
		t.Fatalf("upstream mode without the opt-in handed the broker's tag 1 out as %d", got)
	}
	// sendRecoverySafe leaves every tag to the broker, as upstream does.
	if ch.connection.safeRecovery() {
		t.Fatal("safeRecovery() with neither a read path nor the opt-in")
	}
}

func TestPendingConfirmationsEndStale(t *testing.T) {
	ch := taggedChannel(t, 0)
	ch.confirms = newConfirms()
	pending := ch.confirms.publish()
	ch.nextGeneration()
	ch.confirms.reset() // what resetState does next
	ok, err := pending.WaitContext(context.Background())
	if ok || !errors.Is(err, ErrStaleConfirmation) || !errors.Is(err, ErrClosed) {
		t.Fatalf("a confirmation pending across a recovery: %v, %v; want false and ErrStaleConfirmation", ok, err)
	}
	if !errors.Is(pending.Err(), ErrStaleConfirmation) {
		t.Fatalf("Err() = %v", pending.Err())
	}
	// The new generation's tag 1 is a new confirmation.
	next := ch.confirms.publish()
	if next.DeliveryTag != 1 || next.Err() != nil {
		t.Fatalf("the next generation's first publish: tag %d, Err %v", next.DeliveryTag, next.Err())
	}
	ch.confirms.One(Confirmation{DeliveryTag: 1, Ack: true})
	if ok, err := next.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("its confirm: %v, %v", ok, err)
	}
}

func TestPendingConfirmationsWithoutOptInAreUpstreams(t *testing.T) {
	ch := &Channel{id: 1, connection: &Connection{}}
	ch.confirms = newConfirms()
	pending := ch.confirms.publish()
	ch.nextGeneration()
	ch.confirms.reset()
	if ok, err := pending.WaitContext(context.Background()); ok || err != nil {
		t.Fatalf("upstream mode without the opt-in: %v, %v; want upstream's false, nil", ok, err)
	}
}

func TestPublishRefusedWhileChannelRecovers(t *testing.T) {
	ch := taggedChannel(t, 0)
	ch.lifeCycle = newLifeCycle()
	ch.connection.Config.Recovery = &Recovery{}
	for _, tc := range []struct {
		state LifeCycleState
		want  error
	}{
		{StateClosed, nil}, // a channel never recovered keeps its first state
		{StateReconnecting, ErrChannelRecovering},
		{StateOpen, nil},
	} {
		ch.lifeCycle.SetState(tc.state, nil)
		err := ch.midRecovery()
		if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
			t.Fatalf("%v: midRecovery = %v, want %v", tc.state, err, tc.want)
		}
		if tc.want != nil && !errors.Is(err, ErrClosed) {
			t.Fatalf("%v: %v does not wrap ErrClosed", tc.state, err)
		}
	}
	// Without recovery there is nothing to wait for.
	ch.connection.Config.Recovery = nil
	ch.lifeCycle.SetState(StateReconnecting, nil)
	if err := ch.midRecovery(); err != nil {
		t.Fatalf("no Config.Recovery: midRecovery = %v, want nil", err)
	}
}
