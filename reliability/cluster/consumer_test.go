package cluster

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	amqp "github.com/rabbitmq/amqp091-go"
)

// recoveryModes are the read modes whose connections recover by
// themselves (plain legacy needs a caller draining).
var recoveryModes = []compat.Mode{compat.Upstream, compat.Drainer, compat.LegacyAutoDrain}

// TestRecoveringConsumer: a plain amqp091 consumer, with Config.Recovery
// and compat.DialCluster's endpoint list, on the node that is then killed
// (kill -9) receives again: recovery moves its connection to another node
// and re-subscribes the consumer, and deliveries keep coming on the same
// Go channel. One kill serves every read mode, each with its own quorum
// queue (leader on a, away from the killed node). Package failover's
// Consumer is checked the same way in TestFaults (faults 4 and 6b).
func TestRecoveringConsumer(t *testing.T) {
	rounds(t)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dial := func(first cluster.Node, mode compat.Mode, cfg amqp.Config) (*amqp.Connection, error) {
		var urls []string
		for i, n := range cluster.Nodes {
			if n == first {
				for k := range cluster.Nodes {
					urls = append(urls, c.URL(cluster.Nodes[(i+k)%len(cluster.Nodes)]))
				}
			}
		}
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return compat.DialCluster(dctx, urls, mode, compat.WithDialer(c.DialContext), compat.WithConfig(cfg))
	}

	u, err := amqp.ParseURI(c.URL(cluster.C))
	if err != nil {
		t.Fatal(err)
	}
	addrC := net.JoinHostPort(u.Host, fmt.Sprint(u.Port))

	// The publisher, and the queues' declarer, on a: the node killed is c.
	pub, err := dial(cluster.A, compat.Upstream, amqp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	pch, err := pub.Channel()
	if err != nil {
		t.Fatal(err)
	}
	type consumer struct {
		mode  compat.Mode
		queue string
		conn  *amqp.Connection
		mu    sync.Mutex
		ids   map[string]bool
	}
	var cons []*consumer
	for _, mode := range recoveryModes {
		q := fmt.Sprintf("pin-recovering-consumer-%s-%d", mode, time.Now().UnixNano()%1e6)
		if _, err := pch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = pch.QueueDelete(q, false, false, false) }()
		conn, err := dial(cluster.C, mode, amqp.Config{
			Heartbeat: 2 * time.Second,
			Recovery: &amqp.Recovery{ReconnectionConfig: &amqp.ReconnectionConfig{
				MaxRetryCount: 1000, RetryInterval: 100 * time.Millisecond,
			}},
		})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		defer conn.Close()
		if got := compat.Endpoint(conn); got != addrC {
			t.Fatalf("%s: consumer on %s, want c (%s)", mode, got, addrC)
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		// Auto-ack: what is checked is that the subscription comes back,
		// not acks across recovery (reliability/noloss covers those).
		deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		k := &consumer{mode: mode, queue: q, conn: conn, ids: map[string]bool{}}
		go func() {
			for d := range deliveries {
				k.mu.Lock()
				k.ids[d.MessageId] = true
				k.mu.Unlock()
			}
		}()
		cons = append(cons, k)
	}
	publish := func(id string) {
		t.Helper()
		for _, k := range cons {
			if err := pch.PublishWithContext(ctx, "", k.queue, false, false, amqp.Publishing{MessageId: id, Body: []byte(id)}); err != nil {
				t.Fatalf("publish %s: %v", id, err)
			}
		}
	}
	// waitFor waits until every consumer has an ID that has prefix,
	// publishing a new one every 100 ms (a message published while the
	// consumer recovers waits in its queue anyway; the repeats only make
	// the wait end sooner), bounded by limit.
	waitFor := func(prefix string, limit time.Duration) map[compat.Mode]time.Duration {
		t.Helper()
		start := time.Now()
		took := map[compat.Mode]time.Duration{}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for seq := 0; len(took) < len(cons); seq++ {
			publish(fmt.Sprintf("%s-%d", prefix, seq))
			for _, k := range cons {
				if _, done := took[k.mode]; done {
					continue
				}
				k.mu.Lock()
				for id := range k.ids {
					if strings.HasPrefix(id, prefix+"-") {
						took[k.mode] = time.Since(start)
						break
					}
				}
				k.mu.Unlock()
			}
			if time.Since(start) > limit {
				var missing []string
				for _, k := range cons {
					if _, done := took[k.mode]; !done {
						missing = append(missing, k.mode.String())
					}
				}
				t.Fatalf("no %q delivery within %v in %v", prefix, limit, missing)
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
		return took
	}
	waitFor("before", 30*time.Second)

	if err := c.Kill(cluster.C); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Restart(ctx, cluster.C); err != nil {
			t.Errorf("restarting c: %v", err)
		}
		if err := c.WaitRunning(ctx, 3); err != nil {
			t.Errorf("waiting for three nodes: %v", err)
		}
	}()
	took := waitFor("after", time.Minute)
	for _, k := range cons {
		at := compat.Endpoint(k.conn)
		if at == addrC {
			t.Errorf("%s: receiving again, but still connected to c (%s), which was killed", k.mode, at)
		}
		t.Logf("%s: received again %v after the kill of its node (c, %s), now connected to %s", k.mode,
			took[k.mode].Round(time.Millisecond), addrC, at)
	}
}
