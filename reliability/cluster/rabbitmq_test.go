package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/clusterfaults"
	amqp "github.com/rabbitmq/amqp091-go"
)

// What RabbitMQ itself does that surprises a client, pinned: if a new
// RabbitMQ release changes it, these fail and say what to revisit.

// TestRabbitMQNackStormAfterLeaderElection pins the nack storm: a channel
// first used while a quorum queue elects a new leader (its leader's node
// was just killed) has every publish nacked, for good, while a channel
// opened afterwards on the same connection is acked. Package failover
// cures it by opening a new channel on a nack (KeepChannelOnNack false).
func TestRabbitMQNackStormAfterLeaderElection(t *testing.T) {
	rounds(t)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	queue := fmt.Sprintf("pin-nackstorm-%d", time.Now().UnixNano()%1e6)

	// The queue's leader on b; the client on c.
	admin, err := compat.DialCluster(ctx, []string{c.URL(cluster.B)}, compat.Upstream, compat.WithDialer(c.DialContext))
	if err != nil {
		t.Fatal(err)
	}
	ach, err := admin.Channel()
	if err == nil {
		_, err = ach.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	}
	_ = admin.Close()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := compat.DialCluster(ctx, []string{c.URL(cluster.C)}, compat.Drainer, compat.WithDialer(c.DialContext))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
		}
	})

	if err := c.Kill(cluster.B); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Restart(ctx, cluster.B); err != nil {
			t.Errorf("restarting b: %v", err)
		}
		if err := c.WaitRunning(ctx, 3); err != nil {
			t.Errorf("waiting for three nodes: %v", err)
		}
	}()
	// At once, inside the election (under half a second): a new channel.
	old, err := conn.Channel()
	if err == nil {
		err = old.Confirm(false)
	}
	if err != nil {
		t.Fatal(err)
	}
	oldAcks, oldNacks, acksAfterNack := publishFor(ctx, t, old, queue, 4*time.Second)
	if oldNacks == 0 {
		t.Skipf("the first channel was not used inside the leader election (%d acks, no nack): nothing to pin this time", oldAcks)
	}
	fresh, err := conn.Channel()
	if err == nil {
		err = fresh.Confirm(false)
	}
	if err != nil {
		t.Fatal(err)
	}
	freshAcks, freshNacks, _ := publishFor(ctx, t, fresh, queue, time.Second)
	t.Logf("channel opened during the election: %d acks, %d nacks (%d acks after the first nack); opened after it: %d acks, %d nacks",
		oldAcks, oldNacks, acksAfterNack, freshAcks, freshNacks)
	if acksAfterNack > 0 {
		t.Errorf("the channel first used during the election was acked again after a nack (%d acks): RabbitMQ's nack storm ended by itself; revisit failover's reopen-on-nack and docs/clusters.md", acksAfterNack)
	}
	if freshAcks == 0 || freshNacks > 0 {
		t.Errorf("a channel opened after the election: %d acks, %d nacks; want acks only", freshAcks, freshNacks)
	}
}

// publishFor publishes on ch every 20 ms for d and waits for every
// confirm: acks, nacks, and acks that came after the first nack.
func publishFor(ctx context.Context, t *testing.T, ch *amqp.Channel, queue string, d time.Duration) (acks, nacks, acksAfterNack int) {
	t.Helper()
	var dcs []*amqp.DeferredConfirmation
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); {
		<-tick.C
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("pin")})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		dcs = append(dcs, dc)
	}
	for _, dc := range dcs {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ok, err := dc.WaitContext(wctx)
		cancel()
		switch {
		case err != nil:
			t.Fatalf("confirm of tag %d: %v", dc.DeliveryTag, err)
		case ok:
			acks++
			if nacks > 0 {
				acksAfterNack++
			}
		default:
			nacks++
		}
	}
	return acks, nacks, acksAfterNack
}

// TestRabbitMQHealedPartitionStaysRecorded pins RabbitMQ's default
// `ignore` partition handling: once the nodes noticed a cut, healing the
// network does not end the partition; both sides keep it recorded until
// the minority node's app restarts (which clusterfaults.HealAndRejoin
// does).
func TestRabbitMQHealedPartitionStaysRecorded(t *testing.T) {
	rounds(t)
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.Partition(cluster.B, cluster.CutPeers); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = c.Heal()
		}
		if _, err := clusterfaults.HealAndRejoin(ctx, c, cluster.B); err != nil {
			t.Errorf("rejoining b: %v", err)
		}
	}()
	// Noticed: a no longer counts b as running (net_ticktime 5 s).
	noticed := clusterfaults.WaitFor(ctx, time.Minute, func() bool {
		running, err := runningNodes(ctx, c, cluster.A)
		return err == nil && !strings.Contains(running, "amqpd-b")
	})
	if !noticed {
		t.Fatal("a still counts b as running a minute into the cut")
	}
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	healed = true
	var parts map[string][]string
	recorded := clusterfaults.WaitFor(ctx, 30*time.Second, func() bool {
		p, err := clusterfaults.Partitions(ctx, c)
		parts = p
		return err == nil && len(p) > 0
	})
	if !recorded {
		t.Fatal("no partition recorded after the heal: RabbitMQ's ignore mode now heals by itself; revisit HealAndRejoin and docs/clusters.md")
	}
	t.Logf("recorded after the heal: %v", parts)
	// Still recorded four ticks later.
	cleared := clusterfaults.WaitFor(ctx, 20*time.Second, func() bool {
		p, err := clusterfaults.Partitions(ctx, c)
		return err == nil && len(p) == 0
	})
	if cleared {
		t.Error("the partition cleared by itself after the heal: RabbitMQ's ignore mode now heals; revisit HealAndRejoin and docs/clusters.md")
	}
}

// runningNodes returns node n's view of the running nodes, as text.
func runningNodes(ctx context.Context, c *cluster.Cluster, n cluster.Node) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := c.Ctl(cctx, n, "cluster_status", "--formatter", "json")
	if err != nil {
		return "", err
	}
	var st struct {
		Running []string `json:"running_nodes"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return "", err
	}
	return strings.Join(st.Running, " "), nil
}
