package promamqp

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fixedStats exposes a made-up Stats through a Collector's conversion, so
// that summing, maxima and the label options can be checked against a
// snapshot with several channels and consumers, which a live connection
// would only hold by chance.
type fixedStats struct {
	c    *Collector
	name string
	s    amqp.Stats
}

func (f fixedStats) Describe(ch chan<- *prometheus.Desc) { f.c.Describe(ch) }
func (f fixedStats) Collect(ch chan<- prometheus.Metric) { f.c.collectStats(ch, f.name, &f.s) }

var statsMetrics = []string{
	"amqp091_connection_info",
	"amqp091_bytes_received_total", "amqp091_bytes_sent_total",
	"amqp091_frames_received_total", "amqp091_frames_sent_total",
	"amqp091_socket_writes_total", "amqp091_coalesced_publishes_total",
	"amqp091_settle_refused_total",
	"amqp091_credential_refreshes_total", "amqp091_credential_refresh_errors_total",
	"amqp091_credential_expiry_timestamp_seconds",
	"amqp091_budget_limit_bytes", "amqp091_budget_used_bytes",
	"amqp091_budget_paused", "amqp091_budget_paused_seconds_total",
	"amqp091_listener_queued", "amqp091_listener_queued_bytes", "amqp091_listener_oldest_seconds",
	"amqp091_consumer_queued", "amqp091_consumer_queued_bytes", "amqp091_consumer_oldest_seconds",
}

// sample holds two channels' worth of listeners and three consumers, two
// of which share a tag on different channels.
var sample = amqp.Stats{
	Mode:     "drainer",
	BytesIn:  1000,
	BytesOut: 2000,
	FramesIn: 10, FramesOut: 20,
	Writes: 7, CoalescedPublishes: 2,
	StaleSettlements: 3, UnknownTagSettlements: 1,
	// A quarter second past a whole one: the gauge keeps the fraction.
	Credentials: amqp.CredentialStats{Refreshes: 12, Failures: 2, Expires: time.Unix(1767225600, 250e6)},
	Budget:      amqp.BudgetStats{Limit: 4096, Used: 3000, Paused: true, Pauses: 3, PausedTotal: 1500 * time.Millisecond},
	Listeners: []amqp.ListenerStats{
		{Kind: amqp.KindNotifyPublish, Channel: 1, Queued: 5, QueuedBytes: 500, OldestAge: 2 * time.Second},
		{Kind: amqp.KindNotifyPublish, Channel: 2, Queued: 1, QueuedBytes: 100, OldestAge: 7 * time.Second},
		{Kind: amqp.KindNotifyReturn, Channel: 2, Queued: 2, QueuedBytes: 300, OldestAge: time.Second},
	},
	Consumers: []amqp.ConsumerStats{
		{Channel: 1, ConsumerTag: "orders", Queued: 4, QueuedBytes: 1000, OldestAge: 3 * time.Second},
		{Channel: 2, ConsumerTag: "orders", Queued: 1, QueuedBytes: 200, OldestAge: 4 * time.Second},
		{Channel: 2, ConsumerTag: "audit", Queued: 2, QueuedBytes: 400, OldestAge: 500 * time.Millisecond},
	},
}

const sampleCommon = `
# HELP amqp091_connection_info Always 1; its labels say which read mode a watched connection runs in.
# TYPE amqp091_connection_info gauge
amqp091_connection_info{connection="c1",mode="drainer"} 1
# HELP amqp091_bytes_received_total Bytes read from the connection's socket over its whole life, recoveries included.
# TYPE amqp091_bytes_received_total counter
amqp091_bytes_received_total{connection="c1"} 1000
# HELP amqp091_bytes_sent_total Bytes written to the connection's socket over its whole life, recoveries included.
# TYPE amqp091_bytes_sent_total counter
amqp091_bytes_sent_total{connection="c1"} 2000
# HELP amqp091_frames_received_total AMQP frames read from the connection's socket, heartbeats included.
# TYPE amqp091_frames_received_total counter
amqp091_frames_received_total{connection="c1"} 10
# HELP amqp091_frames_sent_total AMQP frames written to the connection's socket, heartbeats included.
# TYPE amqp091_frames_sent_total counter
amqp091_frames_sent_total{connection="c1"} 20
# HELP amqp091_socket_writes_total Writes of frames to the connection's socket (a write or writev system call each; the drainer's heartbeats are not counted, legacy's are); frames_sent_total over this is the frames per write.
# TYPE amqp091_socket_writes_total counter
amqp091_socket_writes_total{connection="c1"} 7
# HELP amqp091_coalesced_publishes_total Publishes that went out in the same write as another publisher's (CoalescePublishes); 0 with the option off.
# TYPE amqp091_coalesced_publishes_total counter
amqp091_coalesced_publishes_total{connection="c1"} 2
# HELP amqp091_settle_refused_total Acks, nacks and rejects refused and not sent, by reason: stale_delivery for a delivery from before its channel recovered, unknown_delivery_tag for a tag never handed out (safe recovery; always 0 without it).
# TYPE amqp091_settle_refused_total counter
amqp091_settle_refused_total{connection="c1",reason="stale_delivery"} 3
amqp091_settle_refused_total{connection="c1",reason="unknown_delivery_tag"} 1
# HELP amqp091_credential_refreshes_total Refreshes of expiring credentials (OAuth 2 tokens) whose new secret the broker took with update-secret; failed ones are in amqp091_credential_refresh_errors_total instead.
# TYPE amqp091_credential_refreshes_total counter
amqp091_credential_refreshes_total{connection="c1"} 12
# HELP amqp091_credential_refresh_errors_total Refreshes of expiring credentials that failed: the provider failed, hung or answered with an expired secret, or the broker refused update-secret. Each is retried until the secret expires.
# TYPE amqp091_credential_refresh_errors_total counter
amqp091_credential_refresh_errors_total{connection="c1"} 2
# HELP amqp091_credential_expiry_timestamp_seconds When the secret the broker holds for the connection expires, in Unix seconds; absent unless its credentials expire (amqp.ExpiringAuth). This minus time() is the time left before the broker refuses what the connection has not done before (docs/oauth2.md).
# TYPE amqp091_credential_expiry_timestamp_seconds gauge
amqp091_credential_expiry_timestamp_seconds{connection="c1"} 1.76722560025e+09
# HELP amqp091_budget_limit_bytes The drainer's memory budget; 0 when the read path keeps none (legacy mode).
# TYPE amqp091_budget_limit_bytes gauge
amqp091_budget_limit_bytes{connection="c1"} 4096
# HELP amqp091_budget_used_bytes Bytes read from the socket that still wait for the application; reading pauses when this reaches the limit.
# TYPE amqp091_budget_used_bytes gauge
amqp091_budget_used_bytes{connection="c1"} 3000
# HELP amqp091_budget_paused 1 while reading is paused because the budget is full, else 0.
# TYPE amqp091_budget_paused gauge
amqp091_budget_paused{connection="c1"} 1
# HELP amqp091_budget_paused_seconds_total Time reading has been paused for the budget, the current pause included.
# TYPE amqp091_budget_paused_seconds_total counter
amqp091_budget_paused_seconds_total{connection="c1"} 1.5
`

// Default labels: listeners summed per kind over channels (oldest: max),
// every known kind present even when empty; consumers summed into one
// series.
func TestStatsSummed(t *testing.T) {
	want := sampleCommon + `
# HELP amqp091_listener_queued Notifications waiting for a listener (NotifyPublish, NotifyReturn, ...), summed over channels unless channel labels are on.
# TYPE amqp091_listener_queued gauge
amqp091_listener_queued{connection="c1",kind="DeferredConfirmation"} 0
amqp091_listener_queued{connection="c1",kind="NotifyBlocked"} 0
amqp091_listener_queued{connection="c1",kind="NotifyCancel"} 0
amqp091_listener_queued{connection="c1",kind="NotifyFlow"} 0
amqp091_listener_queued{connection="c1",kind="NotifyPublish"} 6
amqp091_listener_queued{connection="c1",kind="NotifyReturn"} 2
# HELP amqp091_listener_queued_bytes What the notifications waiting for listeners are charged to the budget.
# TYPE amqp091_listener_queued_bytes gauge
amqp091_listener_queued_bytes{connection="c1",kind="DeferredConfirmation"} 0
amqp091_listener_queued_bytes{connection="c1",kind="NotifyBlocked"} 0
amqp091_listener_queued_bytes{connection="c1",kind="NotifyCancel"} 0
amqp091_listener_queued_bytes{connection="c1",kind="NotifyFlow"} 0
amqp091_listener_queued_bytes{connection="c1",kind="NotifyPublish"} 600
amqp091_listener_queued_bytes{connection="c1",kind="NotifyReturn"} 300
# HELP amqp091_listener_oldest_seconds Age of the oldest notification waiting for a listener, the maximum over channels unless channel labels are on; a listener nobody reads shows here first.
# TYPE amqp091_listener_oldest_seconds gauge
amqp091_listener_oldest_seconds{connection="c1",kind="DeferredConfirmation"} 0
amqp091_listener_oldest_seconds{connection="c1",kind="NotifyBlocked"} 0
amqp091_listener_oldest_seconds{connection="c1",kind="NotifyCancel"} 0
amqp091_listener_oldest_seconds{connection="c1",kind="NotifyFlow"} 0
amqp091_listener_oldest_seconds{connection="c1",kind="NotifyPublish"} 7
amqp091_listener_oldest_seconds{connection="c1",kind="NotifyReturn"} 1
# HELP amqp091_consumer_queued Deliveries waiting for the application to receive them from a Consume chan, summed over consumers unless consumer labels are on.
# TYPE amqp091_consumer_queued gauge
amqp091_consumer_queued{connection="c1"} 7
# HELP amqp091_consumer_queued_bytes What the deliveries waiting for consumers are charged to the budget.
# TYPE amqp091_consumer_queued_bytes gauge
amqp091_consumer_queued_bytes{connection="c1"} 1600
# HELP amqp091_consumer_oldest_seconds Age of the oldest delivery waiting for a consumer, the maximum over consumers unless consumer labels are on.
# TYPE amqp091_consumer_oldest_seconds gauge
amqp091_consumer_oldest_seconds{connection="c1"} 4
`
	f := fixedStats{c: New(), name: "c1", s: sample}
	if err := testutil.CollectAndCompare(f, strings.NewReader(want), statsMetrics...); err != nil {
		t.Fatal(err)
	}
}

// WithChannelLabels: one series per channel and kind, no zero-filled
// kinds; WithConsumerTagLabels alone: the two "orders" consumers on
// different channels are summed rather than colliding.
func TestStatsLabelOptions(t *testing.T) {
	t.Run("channel", func(t *testing.T) {
		want := `
# HELP amqp091_listener_queued Notifications waiting for a listener (NotifyPublish, NotifyReturn, ...), summed over channels unless channel labels are on.
# TYPE amqp091_listener_queued gauge
amqp091_listener_queued{channel="1",connection="c1",kind="NotifyPublish"} 5
amqp091_listener_queued{channel="2",connection="c1",kind="NotifyPublish"} 1
amqp091_listener_queued{channel="2",connection="c1",kind="NotifyReturn"} 2
# HELP amqp091_consumer_queued Deliveries waiting for the application to receive them from a Consume chan, summed over consumers unless consumer labels are on.
# TYPE amqp091_consumer_queued gauge
amqp091_consumer_queued{channel="1",connection="c1"} 4
amqp091_consumer_queued{channel="2",connection="c1"} 3
`
		f := fixedStats{c: New(WithChannelLabels()), name: "c1", s: sample}
		if err := testutil.CollectAndCompare(f, strings.NewReader(want), "amqp091_listener_queued", "amqp091_consumer_queued"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("consumer_tag", func(t *testing.T) {
		want := `
# HELP amqp091_consumer_queued Deliveries waiting for the application to receive them from a Consume chan, summed over consumers unless consumer labels are on.
# TYPE amqp091_consumer_queued gauge
amqp091_consumer_queued{connection="c1",consumer_tag="audit"} 2
amqp091_consumer_queued{connection="c1",consumer_tag="orders"} 5
# HELP amqp091_consumer_oldest_seconds Age of the oldest delivery waiting for a consumer, the maximum over consumers unless consumer labels are on.
# TYPE amqp091_consumer_oldest_seconds gauge
amqp091_consumer_oldest_seconds{connection="c1",consumer_tag="audit"} 0.5
amqp091_consumer_oldest_seconds{connection="c1",consumer_tag="orders"} 4
`
		f := fixedStats{c: New(WithConsumerTagLabels()), name: "c1", s: sample}
		if err := testutil.CollectAndCompare(f, strings.NewReader(want), "amqp091_consumer_queued", "amqp091_consumer_oldest_seconds"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("both", func(t *testing.T) {
		want := `
# HELP amqp091_consumer_queued_bytes What the deliveries waiting for consumers are charged to the budget.
# TYPE amqp091_consumer_queued_bytes gauge
amqp091_consumer_queued_bytes{channel="1",connection="c1",consumer_tag="orders"} 1000
amqp091_consumer_queued_bytes{channel="2",connection="c1",consumer_tag="audit"} 400
amqp091_consumer_queued_bytes{channel="2",connection="c1",consumer_tag="orders"} 200
`
		f := fixedStats{c: New(WithChannelLabels(), WithConsumerTagLabels()), name: "c1", s: sample}
		if err := testutil.CollectAndCompare(f, strings.NewReader(want), "amqp091_consumer_queued_bytes"); err != nil {
			t.Fatal(err)
		}
	})
}

// Upstream mode counts only FramesIn and, with Config.SafeRecovery, the
// refused settlements and the credential refreshes: the rest is left out
// rather than reported as zeros.
func TestStatsUpstreamMode(t *testing.T) {
	want := `
# HELP amqp091_connection_info Always 1; its labels say which read mode a watched connection runs in.
# TYPE amqp091_connection_info gauge
amqp091_connection_info{connection="u",mode="upstream"} 1
# HELP amqp091_frames_received_total AMQP frames read from the connection's socket, heartbeats included.
# TYPE amqp091_frames_received_total counter
amqp091_frames_received_total{connection="u"} 42
# HELP amqp091_settle_refused_total Acks, nacks and rejects refused and not sent, by reason: stale_delivery for a delivery from before its channel recovered, unknown_delivery_tag for a tag never handed out (safe recovery; always 0 without it).
# TYPE amqp091_settle_refused_total counter
amqp091_settle_refused_total{connection="u",reason="stale_delivery"} 2
amqp091_settle_refused_total{connection="u",reason="unknown_delivery_tag"} 0
# HELP amqp091_credential_refreshes_total Refreshes of expiring credentials (OAuth 2 tokens) whose new secret the broker took with update-secret; failed ones are in amqp091_credential_refresh_errors_total instead.
# TYPE amqp091_credential_refreshes_total counter
amqp091_credential_refreshes_total{connection="u"} 3
# HELP amqp091_credential_refresh_errors_total Refreshes of expiring credentials that failed: the provider failed, hung or answered with an expired secret, or the broker refused update-secret. Each is retried until the secret expires.
# TYPE amqp091_credential_refresh_errors_total counter
amqp091_credential_refresh_errors_total{connection="u"} 1
# HELP amqp091_credential_expiry_timestamp_seconds When the secret the broker holds for the connection expires, in Unix seconds; absent unless its credentials expire (amqp.ExpiringAuth). This minus time() is the time left before the broker refuses what the connection has not done before (docs/oauth2.md).
# TYPE amqp091_credential_expiry_timestamp_seconds gauge
amqp091_credential_expiry_timestamp_seconds{connection="u"} 1.7672256e+09
`
	f := fixedStats{c: New(), name: "u", s: amqp.Stats{Mode: "upstream", FramesIn: 42, StaleSettlements: 2,
		Credentials: amqp.CredentialStats{Refreshes: 3, Failures: 1, Expires: time.Unix(1767225600, 0)}}}
	if err := testutil.CollectAndCompare(f, strings.NewReader(want), statsMetrics...); err != nil {
		t.Fatal(err)
	}
}

// Without expiring credentials Stats.Credentials is zero: the counters
// are sent as zeros, like settle_refused_total without safe recovery, but
// the expiry is left out, since a 0 timestamp would read as a secret that
// expired in 1970 and fire every alert on the time left.
func TestStatsNoExpiringCredentials(t *testing.T) {
	want := `
# HELP amqp091_credential_refreshes_total Refreshes of expiring credentials (OAuth 2 tokens) whose new secret the broker took with update-secret; failed ones are in amqp091_credential_refresh_errors_total instead.
# TYPE amqp091_credential_refreshes_total counter
amqp091_credential_refreshes_total{connection="plain"} 0
# HELP amqp091_credential_refresh_errors_total Refreshes of expiring credentials that failed: the provider failed, hung or answered with an expired secret, or the broker refused update-secret. Each is retried until the secret expires.
# TYPE amqp091_credential_refresh_errors_total counter
amqp091_credential_refresh_errors_total{connection="plain"} 0
`
	for _, mode := range []string{"drainer", "legacy", "upstream"} {
		f := fixedStats{c: New(), name: "plain", s: amqp.Stats{Mode: mode}}
		if err := testutil.CollectAndCompare(f, strings.NewReader(want),
			"amqp091_credential_refreshes_total", "amqp091_credential_refresh_errors_total",
			"amqp091_credential_expiry_timestamp_seconds"); err != nil {
			t.Errorf("%s: %v", mode, err)
		}
	}
}

// WithConstLabels reaches the Stats series too, so that two Collectors
// can share a registry.
func TestConstLabels(t *testing.T) {
	want := `
# HELP amqp091_bytes_sent_total Bytes written to the connection's socket over its whole life, recoveries included.
# TYPE amqp091_bytes_sent_total counter
amqp091_bytes_sent_total{connection="c1",service="billing"} 2000
`
	f := fixedStats{c: New(WithConstLabels(prometheus.Labels{"service": "billing"})), name: "c1", s: sample}
	if err := testutil.CollectAndCompare(f, strings.NewReader(want), "amqp091_bytes_sent_total"); err != nil {
		t.Fatal(err)
	}
}
