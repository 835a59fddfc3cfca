// Package promamqp exposes the patched amqp091-go client's observability
// API to Prometheus: the counters of an amqp.Observer, and the Stats
// snapshot of the connections it watches.
//
// The two sources answer different questions. The Observer sees every
// event as it happens (a publish, a confirm, a delivery, an RPC), so its
// counters and latency histograms are exact, but it costs something per
// event; here that cost is a few atomic adds, with no allocation and no
// lock, because the funcs run on the client's fast paths. Stats is read
// only when Prometheus scrapes: what the connection moved on its socket
// and what it holds for the application right now (the drainer's budget,
// notifications waiting for listeners, deliveries waiting for
// consumers), which is where a stuck consumer or an unread NotifyPublish
// listener shows.
//
// Use:
//
//	metrics := promamqp.New()
//	prometheus.MustRegister(metrics)
//	conn, err := amqp.DialConfig(url, amqp.Config{
//		ReadPath: amqp.Drainer(amqp.DrainerOptions{Observer: metrics.Observer()}),
//	})
//	...
//	metrics.Watch("orders", conn)
//
// # Metrics from the Observer
//
// These have no connection label: one Observer may serve several
// connections and its funcs are not told which one called them. The
// drainer and legacy read modes call the Observer; upstream mode calls
// none, and of the publishes only the fast path's are observed
// (PublishWithContext and PublishWithDeferredConfirmWithContext, not the
// older Publish and PublishWithDeferredConfirm).
//
//	amqp091_published_total                      publishes written (the ...WithContext publishes)
//	amqp091_publish_errors_total                 publishes that returned an error
//	amqp091_confirmed_total{outcome=ack|nack}    confirms, one per delivery tag
//	amqp091_confirm_latency_seconds              histogram: publish written to confirm
//	amqp091_returned_total                       basic.return
//	amqp091_delivered_total                      consumer deliveries read
//	amqp091_handler_seconds                      histogram: ConsumeFunc handler runs
//	amqp091_handler_errors_total                 handler runs that returned an error
//	amqp091_settled_total{kind=ack|nack|reject}  settlements sent (multiple=true counts once)
//	amqp091_rpc_seconds{method}                  histogram: synchronous methods, by request
//	amqp091_rpc_errors_total{method}             synchronous methods that failed
//	amqp091_budget_pauses_total                  reading paused for the budget
//	amqp091_budget_pause_duration_seconds        histogram: how long each pause lasted
//	amqp091_listeners_dropped_total              listeners closed by DropStalledListener
//	amqp091_connection_events_total{kind}        opened, recovered, closed, failed
//
// Successful and failed publishes and settlements are counted apart, so
// that published_total + publish_errors_total is every call. A latency
// histogram's _count, by contrast, is every call, failed ones included,
// and the errors counter is a subset of it. The method label takes only
// AMQP 0-9-1 method names, or "other": its cardinality is bounded
// whatever the broker sends.
//
// # Metrics from Stats
//
// These have the label connection, the name given to Watch.
//
//	amqp091_connection_info{mode}                always 1: the read mode
//	amqp091_bytes_received_total                 socket bytes read
//	amqp091_bytes_sent_total                     socket bytes written
//	amqp091_frames_received_total                frames read
//	amqp091_frames_sent_total                    frames written
//	amqp091_socket_writes_total                  writes of frames to the socket
//	amqp091_coalesced_publishes_total            publishes that shared another's write
//	amqp091_settle_refused_total{reason}         acks refused: stale_delivery, unknown_delivery_tag
//	amqp091_credential_refreshes_total           expiring credentials refreshed (update-secret taken)
//	amqp091_credential_refresh_errors_total      refreshes that failed (provider, expired answer, refusal)
//	amqp091_credential_expiry_timestamp_seconds  when the broker's secret expires, Unix seconds
//	amqp091_budget_limit_bytes                   the drainer's budget
//	amqp091_budget_used_bytes                    bytes waiting for the application
//	amqp091_budget_paused                        1 while reading is paused
//	amqp091_budget_paused_seconds_total          time reading was paused
//	amqp091_listener_queued{kind}                notifications waiting for listeners
//	amqp091_listener_queued_bytes{kind}          their charge to the budget
//	amqp091_listener_oldest_seconds{kind}        age of the oldest, max over channels
//	amqp091_consumer_queued                      deliveries waiting for consumers
//	amqp091_consumer_queued_bytes                their charge to the budget
//	amqp091_consumer_oldest_seconds              age of the oldest, max over consumers
//
// Listener and consumer gauges are summed over channels (the oldest
// ages: their maximum), because channel ids and generated consumer tags
// are unbounded over a process's life and would make a series each.
// WithChannelLabels and WithConsumerTagLabels add those labels for
// debugging. In upstream mode, whose reader counts only the frames it
// reads, only connection_info, frames_received_total, and
// settle_refused_total and the credential series (counted with
// Config.SafeRecovery) are sent.
//
// The credential series come from Stats alone, like settle_refused_total
// (the Observer's SettleRefused and Refreshed are left nil), so that each
// event is counted once, per connection, in every mode. The expiry is a
// timestamp, absent for a connection whose credentials do not expire;
// alert on the time left, as
//
//	amqp091_credential_expiry_timestamp_seconds - time() < 120
//
// which is exact when the rule runs and falls towards 0 when refreshes
// keep failing. Why a refresh failed is in the client's log, not in a
// label.
package promamqp
