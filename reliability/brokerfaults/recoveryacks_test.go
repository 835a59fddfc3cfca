package brokerfaults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// recoveryMode is a read mode, with or without Config.SafeRecovery.
type recoveryMode struct {
	name string
	mode compat.Mode
	safe bool // set Config.SafeRecovery
}

// recoveryModes are the modes that keep delivery tags unique across a
// recovery: the read paths always, upstream's reader with the opt-in.
var recoveryModes = []recoveryMode{
	{"upstream+SafeRecovery", compat.Upstream, true},
	{"drainer", compat.Drainer, false},
	{"legacy", compat.Legacy, false},
	{"legacy-autodrain", compat.LegacyAutoDrain, false},
}

// TestStaleAckAfterRecovery is issue #27's scenario: a consumer acks
// message 0, holds message 1 (tag 2), and the broker closes the
// connection. Automatic recovery redelivers messages 1 to 4 on the
// recovered channel, where the broker numbers them 1 to 4. Upstream hands
// those tags out as they are, so the held message's Ack (tag 2) acks
// message 2, which the application has not processed, and the
// application's own Ack of message 2 then closes the channel: the three
// messages published next never arrive. With unique tags the held Ack is
// refused with ErrStaleDelivery, nothing is sent, the redeliveries carry
// tags above every earlier one, and the three arrive.
func TestStaleAckAfterRecovery(t *testing.T) {
	level.Require(t)
	api := newMgmt(t)
	for _, m := range recoveryModes {
		t.Run(m.name, func(t *testing.T) {
			verifyNoLeaks(t)
			// The read paths report each refusal to their Observer.
			var refusals refusalLog
			obs := &amqp.Observer{SettleRefused: refusals.add}
			r := newRecovering(t, api, m.mode, m.safe,
				compat.WithDrainerOptions(amqp.DrainerOptions{Observer: obs}),
				compat.WithLegacyOptions(amqp.LegacyOptions{Observer: obs}))
			got := r.receive(t, 5)
			for i, d := range got {
				if d.DeliveryTag != uint64(i+1) || string(d.Body) != fmt.Sprint(i) {
					t.Fatalf("before recovery: delivery %d has tag %d and body %q, want tag %d and body %d", i, d.DeliveryTag, d.Body, i+1, i)
				}
			}
			if err := got[0].Ack(false); err != nil {
				t.Fatalf("ack message 0: %v", err)
			}
			held := got[1]

			r.forceClose(t)

			redelivered := r.receive(t, 4)
			for i, d := range redelivered {
				if string(d.Body) != fmt.Sprint(i+1) || !d.Redelivered {
					t.Fatalf("after recovery: delivery %d is %q (redelivered %v), want message %d redelivered", i, d.Body, d.Redelivered, i+1)
				}
				if d.DeliveryTag <= 5 {
					t.Fatalf("after recovery: message %d has tag %d, which a delivery before the recovery had", i+1, d.DeliveryTag)
				}
			}

			err := held.Ack(false)
			if !errors.Is(err, amqp.ErrStaleDelivery) || !errors.Is(err, amqp.ErrClosed) {
				t.Fatalf("Ack of the message held across the recovery = %v, want an error wrapping ErrStaleDelivery and ErrClosed", err)
			}
			t.Logf("stale ack: %v", err)
			// multiple=true from the old generation is refused too, and
			// reaches nothing of the new one.
			if err := held.Ack(true); !errors.Is(err, amqp.ErrStaleDelivery) {
				t.Fatalf("Ack(multiple) of the held message = %v, want ErrStaleDelivery", err)
			}
			// The raw tag through Channel.Nack follows the same rule.
			if err := r.ch.Nack(held.DeliveryTag, false, true); !errors.Is(err, amqp.ErrStaleDelivery) {
				t.Fatalf("Channel.Nack(%d) = %v, want ErrStaleDelivery", held.DeliveryTag, err)
			}
			// A tag the channel never handed out is refused, not sent.
			bogus := redelivered[len(redelivered)-1].DeliveryTag + 100
			if err := r.ch.Ack(bogus, false); !errors.Is(err, amqp.ErrUnknownDeliveryTag) {
				t.Fatalf("Channel.Ack(%d), a tag never handed out = %v, want ErrUnknownDeliveryTag", bogus, err)
			}

			for _, d := range redelivered {
				if err := d.Ack(false); err != nil {
					t.Fatalf("ack of redelivered message %q: %v", d.Body, err)
				}
			}
			r.publish(t, 5, 8)
			fresh := r.receive(t, 3)
			for i, d := range fresh {
				if string(d.Body) != fmt.Sprint(5+i) {
					t.Fatalf("after the acks: delivery %d is %q, want %d", i, d.Body, 5+i)
				}
			}
			// multiple=true of this generation settles exactly the three.
			if err := fresh[2].Ack(true); err != nil {
				t.Fatalf("Ack(multiple) of the last fresh message: %v", err)
			}
			r.expectEmpty(t)
			// On the closed channel, an ack is upstream's ErrClosed.
			if err := fresh[0].Ack(false); !errors.Is(err, amqp.ErrClosed) || errors.Is(err, amqp.ErrStaleDelivery) {
				t.Errorf("Ack after the channel's Close = %v, want ErrClosed", err)
			}

			s := r.conn.Stats()
			if s.StaleSettlements != 3 || s.UnknownTagSettlements != 1 {
				t.Errorf("Stats: %d stale and %d unknown-tag settlements, want 3 and 1", s.StaleSettlements, s.UnknownTagSettlements)
			}
			if m.mode != compat.Upstream { // upstream mode calls no Observer
				if stale, unknown := refusals.counts(); stale != 3 || unknown != 1 {
					t.Errorf("Observer.SettleRefused: %d stale and %d unknown-tag refusals, want 3 and 1", stale, unknown)
				}
			}
		})
	}
}

// TestUpstreamTagsUnchangedWithoutOptIn: with no option set, upstream mode
// hands out the broker's tags after a recovery, as upstream does.
func TestUpstreamTagsUnchangedWithoutOptIn(t *testing.T) {
	level.Require(t)
	verifyNoLeaks(t)
	r := newRecovering(t, newMgmt(t), compat.Upstream, false)
	got := r.receive(t, 5)
	if err := got[0].Ack(false); err != nil {
		t.Fatal(err)
	}
	r.forceClose(t)
	redelivered := r.receive(t, 4)
	for i, d := range redelivered {
		if d.DeliveryTag != uint64(i+1) {
			t.Fatalf("upstream mode: redelivery %d has tag %d, want the broker's %d", i, d.DeliveryTag, i+1)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	r.expectEmpty(t)
}

// TestConfirmPendingAcrossRecovery: a DeferredConfirmation whose confirm
// has not arrived when the link is cut ends with ErrStaleConfirmation, and
// the recovered channel's confirms, whose tags restart at 1, never reach
// it. The confirm is held back by Toxiproxy (no data from the broker) and
// the link is then reset.
func TestConfirmPendingAcrossRecovery(t *testing.T) {
	level.Require(t)
	// Started before the subtests take their goroutine baselines: the
	// Toxiproxy server (when the test starts its own) and its API client.
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()
	for _, m := range recoveryModes {
		t.Run(m.name, func(t *testing.T) {
			verifyNoLeaks(t)
			confirmPendingAcrossRecovery(t, proxy, m.mode, m.safe)
		})
	}
}

// recovering is a consumer on a connection with automatic recovery, and
// the admin connection that publishes to its queue.
type recovering struct {
	api        *mgmt
	name       string
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	states     chan *amqp.StateChanged // the connection's
	chStates   chan *amqp.StateChanged // the consumer channel's
	admin      *amqp.Channel
	queue      string
}

// recoveryConfig is automatic recovery with a short, bounded retry.
func recoveryConfig(name string, safe bool) amqp.Config {
	cfg := amqp.Config{
		Heartbeat:    heartbeat,
		Properties:   amqp.NewConnectionProperties(),
		SafeRecovery: safe,
		Recovery: &amqp.Recovery{
			TopologyRecoveryMode: amqp.TopologyRecoveryAllEnabled,
			ReconnectionConfig:   &amqp.ReconnectionConfig{MaxRetryCount: 10, RetryInterval: 200 * time.Millisecond},
		},
	}
	cfg.Properties.SetClientConnectionName(name)
	return cfg
}

// newRecovering declares a queue (durable and not exclusive, so that it
// outlives the connection; RabbitMQ 4.3 refuses transient non-exclusive
// queues), publishes messages 0 to 4 to it, and consumes it with manual
// acks and a prefetch of 10 on a recovering connection to url.
func newRecovering(t *testing.T, api *mgmt, mode compat.Mode, safe bool, opts ...compat.Option) *recovering {
	return newRecoveringAt(t, api, testenv.AMQPURL(t), mode, safe, opts...)
}

// newRecoveringAt is newRecovering through url (a proxy's).
func newRecoveringAt(t *testing.T, api *mgmt, url string, mode compat.Mode, safe bool, opts ...compat.Option) *recovering {
	t.Helper()
	adminConn := dial(t, compat.Upstream, uniqueName(t, "admin"))
	admin := testenv.Channel(t, adminConn)
	queue := uniqueName(t, "queue")
	if _, err := admin.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.QueueDelete(queue, false, false, false) })

	r := dialAs(t, api, url, recoveryConfig(uniqueName(t, "conn"), safe), mode, opts...)
	r.admin, r.queue = admin, queue
	r.publish(t, 0, 5)
	if err := r.ch.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	var err error
	if r.deliveries, err = r.ch.Consume(r.queue, "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	return r
}

// publish publishes messages from to to-1, with their numbers as bodies.
func (r *recovering) publish(t *testing.T, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := r.admin.PublishWithContext(context.Background(), "", r.queue, false, false,
			amqp.Publishing{Body: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
}

// receive returns the next n deliveries, failing t if they do not arrive
// within bound.
func (r *recovering) receive(t *testing.T, n int) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	timeout := time.After(bound)
	for len(got) < n {
		select {
		case d, ok := <-r.deliveries:
			if !ok {
				t.Fatalf("the deliveries chan closed after %d of %d deliveries", len(got), n)
			}
			got = append(got, d)
		case <-timeout:
			t.Fatalf("%d of %d deliveries arrived within %v", len(got), n, bound)
		}
	}
	return got
}

// brokerCloses has the broker force-close the connection, through the
// management API.
func (r *recovering) brokerCloses(t *testing.T) {
	t.Helper()
	name := r.api.connectionName(t, r.name)
	if err := r.api.closeConnection(name, "recovery acks test"); err != nil {
		t.Fatal(err)
	}
}

// forceClose has the broker close the connection and waits until
// automatic recovery has reopened it and the consumer's channel.
func (r *recovering) forceClose(t *testing.T) {
	t.Helper()
	r.brokerCloses(t)
	awaitState(t, r.states, amqp.StateReconnecting)
	awaitState(t, r.states, amqp.StateOpen)
	awaitState(t, r.chStates, amqp.StateOpen)
}

// expectEmpty checks that the consumer's channel was not closed since the
// recovery (an ack of a tag the broker does not know closes it, and
// recovery would reopen it) and, once it is closed and its unacked
// messages would be back in the queue, that nothing is left.
func (r *recovering) expectEmpty(t *testing.T) {
	t.Helper()
	select {
	case s := <-r.chStates:
		t.Fatalf("the consumer's channel went from %v to %v after the recovery (error %v): an ack closed it", s.From, s.To, s.Err)
	default:
	}
	if err := r.ch.Close(); err != nil {
		t.Fatalf("the consumer's channel did not close cleanly (the broker closed it?): %v", err)
	}
	q, err := r.admin.QueueDeclarePassive(r.queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Fatalf("%d messages left in the queue after every one was acked", q.Messages)
	}
}

// awaitState waits, within bound, for a transition to state.
func awaitState(t *testing.T, states <-chan *amqp.StateChanged, state amqp.LifeCycleState) {
	t.Helper()
	timeout := time.After(bound)
	for {
		select {
		case s, ok := <-states:
			if !ok {
				t.Fatalf("state notifications closed while waiting for %v", state)
			}
			if s.To == state {
				return
			}
		case <-timeout:
			t.Fatalf("no transition to %v within %v", state, bound)
		}
	}
}

// drainThroughRecovery is a legacy application's drain loop that keeps
// reading through a recovery, until the test ends: DrainEvents fails
// while the connection is down, and the loop waits for the next slice.
func drainThroughRecovery(t *testing.T, conn *amqp.Connection) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		retry := time.NewTicker(drainSlice)
		defer retry.Stop()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), drainSlice)
			err := conn.DrainEvents(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				select {
				case <-stop:
					return
				case <-retry.C:
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
}

// confirmPendingAcrossRecovery is TestConfirmPendingAcrossRecovery in
// one mode.
func confirmPendingAcrossRecovery(t *testing.T, proxy *toxi.Proxy, mode compat.Mode, safe bool) {
	conn, err := compat.DialConfig(proxy.URL(), recoveryConfig(uniqueName(t, "conn"), safe), mode)
	if err != nil {
		t.Fatalf("dial in %v mode: %v", mode, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if mode == compat.Legacy {
		drainThroughRecovery(t, conn)
	}
	states := make(chan *amqp.StateChanged, 16)
	conn.NotifyStateChange(states)
	ch := testenv.Channel(t, conn)
	chStates := make(chan *amqp.StateChanged, 16)
	ch.NotifyStateChange(chStates)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	publish := func() (*amqp.DeferredConfirmation, error) {
		// To the default exchange with a key no queue has: the broker
		// confirms it at once, so only the proxy holds the confirm back.
		return ch.PublishWithDeferredConfirmWithContext(ctx, "", "recoveryacks-nowhere", false, false, amqp.Publishing{Body: []byte("x")})
	}

	first, err := publish()
	if err != nil {
		t.Fatal(err)
	}
	if acked, err := first.WaitContext(ctx); !acked || err != nil {
		t.Fatalf("the first confirm: acked %v, err %v", acked, err)
	}

	// The broker's confirms stop at the proxy; then the link is reset at
	// the next frame the client sends.
	silence := proxy.Timeout(toxi.Downstream, 0)
	pending, err := publish()
	if err != nil {
		t.Fatal(err)
	}
	reset := proxy.ResetPeer(toxi.Upstream, 0)
	if _, err := publish(); err != nil {
		t.Logf("the publish that meets the reset: %v", err)
	}
	awaitState(t, states, amqp.StateReconnecting)
	proxy.RemoveToxic(reset)
	proxy.RemoveToxic(silence)
	awaitState(t, states, amqp.StateOpen)
	awaitState(t, chStates, amqp.StateOpen)

	acked, err := pending.WaitContext(ctx)
	if acked || !errors.Is(err, amqp.ErrStaleConfirmation) || !errors.Is(err, amqp.ErrClosed) {
		t.Fatalf("the confirm pending across the recovery: acked %v, err %v; want false and an error wrapping ErrStaleConfirmation and ErrClosed", acked, err)
	}
	if !errors.Is(pending.Err(), amqp.ErrStaleConfirmation) {
		t.Errorf("Err() = %v, want ErrStaleConfirmation", pending.Err())
	}
	t.Logf("pending confirm (tag %d): %v", pending.DeliveryTag, err)

	// The recovered channel's confirms restart at 1 and are the new
	// publishes' only.
	next, err := publish()
	if err != nil {
		t.Fatalf("publish on the recovered channel: %v", err)
	}
	if acked, err := next.WaitContext(ctx); !acked || err != nil || next.DeliveryTag != 1 {
		t.Fatalf("the recovered channel's first confirm: tag %d, acked %v, err %v; want tag 1, acked, no error", next.DeliveryTag, acked, err)
	}
	if acked, err := pending.WaitContext(ctx); acked || !errors.Is(err, amqp.ErrStaleConfirmation) {
		t.Fatalf("after the new confirm, the stale one reads acked %v, err %v", acked, err)
	}
}

// TestCredentialsAcrossRecovery: a user the test creates (never guest)
// has its password changed with rabbitmqctl while connected, and the
// broker then closes the connection. The recovery logs in with what
// Config.Credentials returns now; with safe recovery and no provider, with
// the secret of the last UpdateSecret. A provider still returning the old
// password gets a refused login whose error names the endpoint and the
// user, never a password.
func TestCredentialsAcrossRecovery(t *testing.T) {
	level.Require(t)
	api := newMgmt(t)
	ctl := needCtl(t, api)
	user := fmt.Sprintf("recoveryacks-%d", time.Now().UnixNano())
	run := func(args ...string) {
		t.Helper()
		if _, err := ctl.run(args...); err != nil {
			t.Fatal(err)
		}
	}
	run("add_user", user, "pw-0")
	t.Cleanup(func() { _, _ = ctl.run("delete_user", user) })
	run("set_permissions", "-p", "/", user, ".*", ".*", ".*")
	generation := 0
	rotate := func() string {
		generation++
		pw := fmt.Sprintf("pw-%d", generation)
		run("change_password", user, pw)
		return pw
	}
	uri, err := amqp.ParseURI(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	uri.Username, uri.Password = user, "pw-0"
	endpoint := fmt.Sprintf("%s:%d", uri.Host, uri.Port)

	for _, m := range allModes() {
		t.Run(m.name+"/provider", func(t *testing.T) {
			verifyNoLeaks(t)
			var password atomic.Value
			password.Store(rotate())
			var calls atomic.Int64
			cfg := recoveryConfig(uniqueName(t, "conn"), m.safe)
			cfg.Recovery.ReconnectionConfig.MaxRetryCount = 3
			cfg.Credentials = func(context.Context) (amqp.Authentication, error) {
				calls.Add(1)
				return &amqp.PlainAuth{Username: user, Password: password.Load().(string)}, nil
			}
			r := dialAs(t, api, testenv.AMQPURL(t), cfg, m.mode)
			if calls.Load() != 1 {
				t.Fatalf("the first dial asked the provider %d times, want 1", calls.Load())
			}

			password.Store(rotate())
			r.forceClose(t)
			if calls.Load() < 2 {
				t.Fatalf("the recovery did not ask the provider (%d calls)", calls.Load())
			}
			r.use(t)

			// The password changes and the provider does not know: every
			// recovery attempt is refused, and the error says where and
			// as whom, never with which password. The error is made by
			// the same code in every mode; two of them show it.
			if m.name != "upstream" && m.name != "drainer" {
				return
			}
			stale := password.Load().(string)
			fresh := rotate()
			end := r.forceCloseFails(t)
			msg := fmt.Sprint(end)
			t.Logf("recovery with a stale password ended: %s", msg)
			if !strings.Contains(msg, endpoint) || !strings.Contains(msg, user) || strings.Contains(msg, stale) || strings.Contains(msg, fresh) {
				t.Errorf("the recovery's error %q should name %s and user %s, and no password", msg, endpoint, user)
			}
		})
	}
	for _, m := range recoveryModes {
		t.Run(m.name+"/UpdateSecret", func(t *testing.T) {
			verifyNoLeaks(t)
			uri.Password = rotate()
			cfg := recoveryConfig(uniqueName(t, "conn"), m.safe)
			r := dialAs(t, api, uri.String(), cfg, m.mode)
			pw := rotate()
			if err := r.conn.UpdateSecret(pw, "rotation"); err != nil {
				t.Fatalf("UpdateSecret: %v", err)
			}
			r.forceClose(t)
			r.use(t)
		})
	}
}

// dialAs opens a recovering connection to url in mode with cfg (whose
// Properties name it), and a channel, both watched for state changes.
func dialAs(t *testing.T, api *mgmt, url string, cfg amqp.Config, mode compat.Mode, opts ...compat.Option) *recovering {
	t.Helper()
	name, _ := cfg.Properties["connection_name"].(string)
	r := &recovering{api: api, name: name}
	conn, err := compat.DialConfig(url, cfg, mode, opts...)
	if err != nil {
		t.Fatalf("dial in %v mode: %v", mode, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r.conn = conn
	if mode == compat.Legacy {
		drainThroughRecovery(t, conn)
	}
	r.states = make(chan *amqp.StateChanged, 16)
	conn.NotifyStateChange(r.states)
	r.ch = testenv.Channel(t, conn)
	r.chStates = make(chan *amqp.StateChanged, 16)
	r.ch.NotifyStateChange(r.chStates)
	return r
}

// use checks that the recovered connection works: a declare on its
// channel.
func (r *recovering) use(t *testing.T) {
	t.Helper()
	if _, err := r.ch.QueueDeclare("", false, true, true, false, nil); err != nil {
		t.Fatalf("declare on the recovered channel: %v", err)
	}
}

// forceCloseFails has the broker close the connection, expects every
// recovery attempt to fail, and returns the error the connection ended
// with.
func (r *recovering) forceCloseFails(t *testing.T) error {
	t.Helper()
	r.brokerCloses(t)
	timeout := time.After(2 * bound)
	for {
		select {
		case s := <-r.states:
			if s.To == amqp.StateOpen {
				t.Fatal("the recovery logged in with a password the broker no longer has")
			}
			if s.To == amqp.StateClosed {
				return s.Err
			}
		case <-timeout:
			t.Fatalf("the recovery did not end within %v", 2*bound)
		}
	}
}

// TestConsumerResumesAfterCutLink: the link to the broker is reset
// (Toxiproxy) under a consumer with automatic recovery: the consumer
// receives again after the recovery, redeliveries first, in every mode.
func TestConsumerResumesAfterCutLink(t *testing.T) {
	level.Require(t)
	proxy := toxi.NewProxy(t, testenv.AMQPAddr(t))
	proxy.ArmResets()
	for _, m := range allModes() {
		t.Run(m.name, func(t *testing.T) {
			verifyNoLeaks(t)
			r := newRecoveringAt(t, nil, proxy.URL(), m.mode, m.safe)
			for _, d := range r.receive(t, 5) {
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
			}
			// The broker answers an RPC on the channel after the acks
			// before it, so none of them is still in flight at the cut.
			if err := r.ch.Qos(10, 0, false); err != nil {
				t.Fatal(err)
			}
			reset := proxy.ResetPeer(toxi.Upstream, 0)
			// A frame from the client meets the reset.
			if err := r.ch.Qos(10, 0, false); err == nil {
				t.Log("the Qos that meets the reset went through before it")
			}
			awaitState(t, r.states, amqp.StateReconnecting)
			proxy.RemoveToxic(reset)
			awaitState(t, r.states, amqp.StateOpen)
			awaitState(t, r.chStates, amqp.StateOpen)
			r.publish(t, 5, 8)
			for i, d := range r.receive(t, 3) {
				if string(d.Body) != fmt.Sprint(5+i) {
					t.Fatalf("after the recovery: delivery %d is %q, want %d", i, d.Body, 5+i)
				}
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
			}
			r.expectEmpty(t)
		})
	}
}

// TestBrokerCancelSurfaced: a consumer whose queue is deleted gets the
// broker's basic.cancel as upstream documents it, in every mode: its tag
// on the channel's NotifyCancel chan, then its deliveries chan closed,
// the channel left open. Automatic recovery does not resubscribe it (the
// connection did not fail); failover.Consumer consumes again with a
// backoff (failover's TestConsumerReconsumesAfterBrokerCancel).
func TestBrokerCancelSurfaced(t *testing.T) {
	level.Require(t)
	api := newMgmt(t)
	for _, m := range allModes() {
		t.Run(m.name, func(t *testing.T) {
			verifyNoLeaks(t)
			r := newRecovering(t, api, m.mode, m.safe)
			cancels := r.ch.NotifyCancel(make(chan string, 1))
			r.receive(t, 5)
			if _, err := r.admin.QueueDelete(r.queue, false, false, false); err != nil {
				t.Fatal(err)
			}
			var tag string
			select {
			case tag = <-cancels:
			case <-time.After(bound):
				t.Fatalf("no basic.cancel on NotifyCancel within %v of the queue's deletion", bound)
			}
			select {
			case d, ok := <-r.deliveries:
				if ok {
					t.Fatalf("a delivery (%q) after the cancel", d.Body)
				}
			case <-time.After(bound):
				t.Fatalf("the deliveries chan did not close within %v of the cancel", bound)
			}
			if r.ch.IsClosed() {
				t.Fatal("the broker's cancel closed the channel")
			}
			t.Logf("cancelled consumer %q; the channel stays open", tag)
		})
	}
}

// allModes are recoveryModes and plain upstream, for what every mode does
// alike.
func allModes() []recoveryMode {
	return append([]recoveryMode{{"upstream", compat.Upstream, false}}, recoveryModes...)
}

// refusalLog counts Observer.SettleRefused's reports by their error.
type refusalLog struct {
	mu             sync.Mutex
	stale, unknown int
}

func (l *refusalLog) add(_ amqp.SettleInfo, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, amqp.ErrStaleDelivery):
		l.stale++
	case errors.Is(err, amqp.ErrUnknownDeliveryTag):
		l.unknown++
	}
}

func (l *refusalLog) counts() (stale, unknown int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stale, l.unknown
}
