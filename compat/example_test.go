package compat_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
)

// Switching an existing program to drainer mode is one changed line.
func ExampleDial() {
	// Before: conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	conn, err := compat.Dial("amqp://guest:guest@127.0.0.1:5672/", compat.Drainer)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	log.Print(conn.ReadMode()) // "drainer"
}

// The mode can come from the environment, so one binary runs in any mode.
func ExampleModeFromEnv() {
	mode, err := compat.ModeFromEnv() // AMQP091_READ_MODE: upstream, legacy, drainer, legacy-autodrain
	if err != nil {
		log.Fatal(err)
	}
	conn, err := compat.Dial("amqp://guest:guest@127.0.0.1:5672/", mode)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

// A mode's tuning rides along as an option; the config is honoured as
// amqp.DialConfig honours it, recovery included.
func ExampleDialConfig() {
	conn, err := compat.DialConfig("amqp://guest:guest@127.0.0.1:5672/",
		amqp.Config{Recovery: &amqp.Recovery{}},
		compat.Drainer,
		compat.WithDrainerOptions(amqp.DrainerOptions{Budget: 16 << 20}))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

// LegacyAutoDrain is legacy mode for code that never calls DrainEvents: a
// goroutine per connection drains, and ends at Close.
func ExampleLegacyAutoDrain() {
	conn, err := compat.Dial("amqp://guest:guest@127.0.0.1:5672/", compat.LegacyAutoDrain)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	log.Print(conn.ReadMode()) // "legacy-autodrain"
}

// DialCluster dials the first node of a cluster that answers, and the
// connection's automatic recovery moves on along the same list when its
// node goes away.
func ExampleDialCluster() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := compat.DialCluster(ctx, []string{
		"amqp://guest:guest@rabbit-1:5672/",
		"amqp://guest:guest@rabbit-2:5672/",
		"amqps://guest:guest@rabbit-3:5671/",
	}, compat.Drainer,
		compat.WithOrder(amqp.RoundRobin),
		compat.WithEndpointTLS("amqps://guest:guest@rabbit-3:5671/", &tls.Config{ServerName: "rabbit-3.internal"}),
		compat.WithConfig(amqp.Config{Recovery: &amqp.Recovery{}}),
		compat.WithBackoff(100*time.Millisecond, 5*time.Second),
		compat.WithAttemptTimeout(5*time.Second),
		compat.WithLogger(slog.Default()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	log.Print("connected to ", compat.Endpoint(conn))
}

// DialContext bounds the dial, TCP connect and TLS and AMQP handshakes
// included, by a context: a broker that accepts connections and never
// answers costs the caller its own deadline, not upstream's 30 s, and a
// cancel (a shutdown) stops the dial at once. The context bounds the dial
// only, not the connection it returns.
func ExampleDialContext() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := compat.DialContext(ctx, "amqp://guest:guest@127.0.0.1:5672/", compat.Drainer)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Fatal("the broker did not complete the handshake within 5 s: ", err)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	cancel() // ending ctx now does not affect conn
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	defer ch.Close()
}

// Every synchronous method has a context variant, in every mode. A call
// whose ctx ends before the reply closes its channel (the reply could not
// be told from the next one's); the connection stays open.
func Example_boundedCalls() {
	conn, err := compat.Dial("amqp://guest:guest@127.0.0.1:5672/", compat.Drainer)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ch, err := conn.ChannelWithContext(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_, err = ch.QueueDeclareWithContext(ctx, "jobs", true, false, false, false, nil)
	var rpcErr *amqp.RPCError
	switch {
	case errors.Is(err, context.DeadlineExceeded) && errors.As(err, &rpcErr):
		// rpcErr.Method is "queue.declare"; ch is closed (errors.Is(err,
		// amqp.ErrClosed)), and a new channel goes on.
		log.Printf("%s got no reply in time: %v", rpcErr.Method, err)
	case err != nil:
		log.Fatal(err) // the broker refused it: a channel exception, as upstream's
	}
}

// Code that cannot pass contexts bounds every synchronous method with the
// read mode's RPCTimeout instead.
func Example_rpcTimeout() {
	conn, err := compat.Dial("amqp://guest:guest@127.0.0.1:5672/", compat.Drainer,
		compat.WithDrainerOptions(amqp.DrainerOptions{RPCTimeout: 10 * time.Second}))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(10, 0, false); errors.Is(err, amqp.ErrRPCTimeout) {
		log.Print("no basic.qos-ok within 10 s: the channel is closed")
	}
}

// With automatic recovery, a delivery received before a recovery cannot
// acknowledge a message delivered after it: its Ack is refused with
// ErrStaleDelivery (which matches ErrClosed), and the message comes back
// on the recovered channel, redelivered, with a tag of its own. Drainer
// and legacy modes always keep tags unique; upstream mode does with
// Config.SafeRecovery.
func Example_ackAcrossRecovery() {
	conn, err := compat.DialConfig("amqp://guest:guest@127.0.0.1:5672/",
		amqp.Config{Recovery: &amqp.Recovery{}, SafeRecovery: true},
		compat.Upstream)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("orders", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	for d := range deliveries {
		handle(d) // idempotent: a message handled but not acked before a loss comes back
		switch err := d.Ack(false); {
		case errors.Is(err, amqp.ErrStaleDelivery):
			// The channel recovered while d was being handled: the
			// broker redelivers d's message, whose ack settles it.
		case err != nil:
			log.Print(err)
		}
	}
}

func handle(amqp.Delivery) {}

// A publisher with many messages writes them in one system call per batch,
// not one per message; in confirm mode each message has its confirmation.
func Example_publishBatch() {
	conn, err := compat.Dial("amqp://guest:guest@127.0.0.1:5672/", compat.Drainer)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	batch := make([]amqp.BatchPublishing, 0, 100)
	for i := 0; i < 100; i++ {
		batch = append(batch, amqp.BatchPublishing{Key: "jobs", Msg: amqp.Publishing{Body: []byte{byte(i)}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// An unencodable message fails the whole batch before a byte is written;
	// a failed write returns the confirmations too, each nacked as the
	// connection ends unless the broker acked it first.
	dcs, err := ch.PublishBatch(ctx, batch)
	if err != nil {
		log.Print(err)
	}
	for _, dc := range dcs {
		if ack, err := dc.WaitContext(ctx); !ack || err != nil {
			log.Printf("message %d not confirmed: %v", dc.DeliveryTag, err)
		}
	}
}

// A provider that says when its token expires (amqp.ExpiringAuth) has the
// connection ask it again at 80% of the token's life and install the new
// token with update-secret, without reconnecting (docs/oauth2.md).
func ExampleDialConfig_expiringCredentials() {
	fetch := func(ctx context.Context) (token string, expiry time.Time, err error) {
		return "", time.Time{}, errors.New("ask your identity provider here")
	}
	cfg := amqp.Config{
		Credentials: func(ctx context.Context) (amqp.Authentication, error) {
			token, expiry, err := fetch(ctx)
			if err != nil {
				return nil, err
			}
			return amqp.ExpiringAuth{Authentication: &amqp.PlainAuth{Password: token}, Expires: expiry}, nil
		},
		SafeRecovery: true, // the opt-in of compat.Upstream; the other modes refresh anyway
	}
	conn, err := compat.DialConfig("amqp://rabbit.example:5672/", cfg, compat.Drainer)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	log.Printf("token expires at %v", conn.Stats().Credentials.Expires)
}
