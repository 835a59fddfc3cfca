package promamqp

import "github.com/prometheus/client_golang/prometheus"

// descs holds every descriptor of a Collector. They are built once at New
// because the label names depend on the options, and Describe and Collect
// must agree on them.
type descs struct {
	// From the Observer.
	published, publishErrors  *prometheus.Desc
	confirmed, confirmLatency *prometheus.Desc
	returned, delivered       *prometheus.Desc
	handler, handlerErrors    *prometheus.Desc
	settled                   *prometheus.Desc
	rpc, rpcErrors            *prometheus.Desc
	budgetPauses, budgetPause *prometheus.Desc
	listenersDropped          *prometheus.Desc
	connectionEvents          *prometheus.Desc

	// From Stats, per watched connection.
	bytesIn, bytesOut                                   *prometheus.Desc
	framesIn, framesOut                                 *prometheus.Desc
	writes, coalescedPublishes                          *prometheus.Desc
	settleRefused                                       *prometheus.Desc
	credentialRefreshes, credentialRefreshErrors        *prometheus.Desc
	credentialExpiry                                    *prometheus.Desc
	info                                                *prometheus.Desc
	budgetLimit, budgetUsed                             *prometheus.Desc
	budgetPaused, budgetPausedSeconds                   *prometheus.Desc
	listenerQueued, listenerQueuedBytes, listenerOldest *prometheus.Desc
	consumerQueued, consumerQueuedBytes, consumerOldest *prometheus.Desc
}

func (d *descs) init(cfg *config) {
	cl := cfg.constLabels
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, cl)
	}

	d.published = desc("published_total",
		"Messages written to the socket by PublishWithContext and PublishWithDeferredConfirmWithContext; failed publishes are in amqp091_publish_errors_total instead.")
	d.publishErrors = desc("publish_errors_total",
		"Publishes that returned an error (closed channel, cancelled context, failed write).")
	d.confirmed = desc("confirmed_total",
		"Publishes the broker confirmed in confirm mode, one per delivery tag, by outcome (ack or nack).",
		"outcome")
	d.confirmLatency = desc("confirm_latency_seconds",
		"Time from writing a publish to its confirm arriving; publishes whose latency the client does not know are left out.")
	d.returned = desc("returned_total",
		"Messages the broker returned as unroutable (basic.return).")
	d.delivered = desc("delivered_total",
		"Consumer deliveries (basic.deliver) read from the socket, counted as they are decoded, before they are queued for the application.")
	d.handler = desc("handler_seconds",
		"How long ConsumeFunc handlers ran; its _count is the number of deliveries handled, errors included.")
	d.handlerErrors = desc("handler_errors_total",
		"ConsumeFunc handler runs that returned an error.")
	d.settled = desc("settled_total",
		"Ack, Nack and Reject frames written, by kind; a call with multiple=true counts once.",
		"kind")
	d.rpc = desc("rpc_seconds",
		"Time from writing a synchronous method to its reply, by the request's method; its _count includes the failed calls.",
		"method")
	d.rpcErrors = desc("rpc_errors_total",
		"Synchronous methods that failed (timeout, cancelled context, closed channel or connection), by method.",
		"method")
	d.budgetPauses = desc("budget_pauses_total",
		"Times the drainer stopped reading the socket because its memory budget was full.")
	d.budgetPause = desc("budget_pause_duration_seconds",
		"How long each pause of reading for the budget lasted, observed when reading resumed.")
	d.listenersDropped = desc("listeners_dropped_total",
		"Listeners closed by the stall policy (DrainerOptions.DropStalledListener).")
	d.connectionEvents = desc("connection_events_total",
		"Events in the lives of connections: opened, recovered, closed (by the application), failed.",
		"kind")

	c := []string{"connection"}
	d.info = desc("connection_info",
		"Always 1; its labels say which read mode a watched connection runs in.",
		"connection", "mode")
	d.bytesIn = desc("bytes_received_total",
		"Bytes read from the connection's socket over its whole life, recoveries included.", c...)
	d.bytesOut = desc("bytes_sent_total",
		"Bytes written to the connection's socket over its whole life, recoveries included.", c...)
	d.framesIn = desc("frames_received_total",
		"AMQP frames read from the connection's socket, heartbeats included.", c...)
	d.framesOut = desc("frames_sent_total",
		"AMQP frames written to the connection's socket, heartbeats included.", c...)
	d.writes = desc("socket_writes_total",
		"Writes of frames to the connection's socket (a write or writev system call each; the drainer's heartbeats are not counted, legacy's are); frames_sent_total over this is the frames per write.", c...)
	d.coalescedPublishes = desc("coalesced_publishes_total",
		"Publishes that went out in the same write as another publisher's (CoalescePublishes); 0 with the option off.", c...)
	d.settleRefused = desc("settle_refused_total",
		"Acks, nacks and rejects refused and not sent, by reason: stale_delivery for a delivery from before its channel recovered, unknown_delivery_tag for a tag never handed out (safe recovery; always 0 without it).",
		"connection", "reason")
	// Successes and failures are counted apart, as publishes are, so that
	// the two add up to every refresh. There is no reason label: Stats
	// does not say why a refresh failed (the client's log does), and
	// taking the reason from the Observer would count each failure twice.
	d.credentialRefreshes = desc("credential_refreshes_total",
		"Refreshes of expiring credentials (OAuth 2 tokens) whose new secret the broker took with update-secret; failed ones are in amqp091_credential_refresh_errors_total instead.", c...)
	d.credentialRefreshErrors = desc("credential_refresh_errors_total",
		"Refreshes of expiring credentials that failed: the provider failed, hung or answered with an expired secret, or the broker refused update-secret. Each is retried until the secret expires.", c...)
	// A timestamp rather than the seconds left, as Prometheus advises for
	// times (process_start_time_seconds, probe_ssl_earliest_cert_expiry):
	// the alert's `expiry - time()` is the time left when the rule runs,
	// whereas a seconds-left gauge is as old as its scrape and overstates
	// it by up to a scrape interval; and the value changes only when a
	// new secret is installed (a refresh, a login), so the series
	// compresses and changes() over it shows each new secret.
	d.credentialExpiry = desc("credential_expiry_timestamp_seconds",
		"When the secret the broker holds for the connection expires, in Unix seconds; absent unless its credentials expire (amqp.ExpiringAuth). This minus time() is the time left before the broker refuses what the connection has not done before (docs/oauth2.md).", c...)
	d.budgetLimit = desc("budget_limit_bytes",
		"The drainer's memory budget; 0 when the read path keeps none (legacy mode).", c...)
	d.budgetUsed = desc("budget_used_bytes",
		"Bytes read from the socket that still wait for the application; reading pauses when this reaches the limit.", c...)
	d.budgetPaused = desc("budget_paused",
		"1 while reading is paused because the budget is full, else 0.", c...)
	d.budgetPausedSeconds = desc("budget_paused_seconds_total",
		"Time reading has been paused for the budget, the current pause included.", c...)

	listener := []string{"connection", "kind"}
	if cfg.channelLabels {
		listener = append(listener, "channel")
	}
	d.listenerQueued = desc("listener_queued",
		"Notifications waiting for a listener (NotifyPublish, NotifyReturn, ...), summed over channels unless channel labels are on.",
		listener...)
	d.listenerQueuedBytes = desc("listener_queued_bytes",
		"What the notifications waiting for listeners are charged to the budget.", listener...)
	d.listenerOldest = desc("listener_oldest_seconds",
		"Age of the oldest notification waiting for a listener, the maximum over channels unless channel labels are on; a listener nobody reads shows here first.",
		listener...)

	consumer := []string{"connection"}
	if cfg.channelLabels {
		consumer = append(consumer, "channel")
	}
	if cfg.consumerTagLabels {
		consumer = append(consumer, "consumer_tag")
	}
	d.consumerQueued = desc("consumer_queued",
		"Deliveries waiting for the application to receive them from a Consume chan, summed over consumers unless consumer labels are on.",
		consumer...)
	d.consumerQueuedBytes = desc("consumer_queued_bytes",
		"What the deliveries waiting for consumers are charged to the budget.", consumer...)
	d.consumerOldest = desc("consumer_oldest_seconds",
		"Age of the oldest delivery waiting for a consumer, the maximum over consumers unless consumer labels are on.",
		consumer...)
}

// all lists every descriptor, for Describe.
func (d *descs) all() []*prometheus.Desc {
	return []*prometheus.Desc{
		d.published, d.publishErrors,
		d.confirmed, d.confirmLatency,
		d.returned, d.delivered,
		d.handler, d.handlerErrors,
		d.settled,
		d.rpc, d.rpcErrors,
		d.budgetPauses, d.budgetPause,
		d.listenersDropped,
		d.connectionEvents,
		d.info,
		d.bytesIn, d.bytesOut,
		d.framesIn, d.framesOut,
		d.writes, d.coalescedPublishes,
		d.settleRefused,
		d.credentialRefreshes, d.credentialRefreshErrors, d.credentialExpiry,
		d.budgetLimit, d.budgetUsed,
		d.budgetPaused, d.budgetPausedSeconds,
		d.listenerQueued, d.listenerQueuedBytes, d.listenerOldest,
		d.consumerQueued, d.consumerQueuedBytes, d.consumerOldest,
	}
}
