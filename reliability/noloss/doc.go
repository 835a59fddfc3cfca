// Package noloss proves at-least-once publishing with confirms through
// repeated connection resets, in drainer mode, both ways a user can
// survive a lost connection: upstream's automatic recovery
// (amqp.Config.Recovery) and a retry loop of their own.
//
// Each run publishes uniquely numbered messages (the ID is the MessageId
// and the body) to a durable queue declared from a direct connection,
// keeps 32 confirmations in flight, and republishes every message whose
// confirmation is not an ack. Between faults it lets spacing more IDs be
// acked, then adds a reset_peer toxic (a real TCP RST) and removes it once
// the loss is noticed: 3 resets short, 20 full. Afterwards it reads the
// whole queue from a direct connection and checks, with
// reliability/internal/ledger:
//
//   - every acked ID is in the queue (lost = 0), so no ack was ever
//     positive for a message the broker did not have;
//   - nothing is in the queue that was never published;
//   - every publish that returned nil was settled: acked, nacked or
//     resolved not acked at the loss, each confirmation within a bound
//     (30 s), none outstanding; and every ID was finally acked.
//
// Duplicates are allowed and counted: a message whose ack was lost with
// the connection is published again.
//
// What upstream v1.17.0's automatic recovery does with confirmations owed
// at the loss, pinned down by TestConfirmationsAtLoss and
// TestNaiveRepublishDuringRecovery (upstream's own behaviour: the same
// tests give the same results in its default read mode):
//
//   - A DeferredConfirmation is not resolved when the connection drops.
//     It stays pending while recovery redials, and is resolved not acked
//     (Done closes, Acked is false, Wait returns false, WaitContext false
//     and no error; with safe recovery, as in drainer mode, WaitContext's
//     error is amqp.ErrStaleConfirmation) when recovery resets the
//     channel, just before it sends channel.open and confirm.select
//     again. (If recovery gives up,
//     its cleanup resolves it the same way, by the code.) Without
//     recovery it is resolved at the loss itself, and the NotifyPublish
//     listener is closed.
//   - A NotifyPublish listener is told nothing about the tags owed at the
//     loss, and stays open; the recovered channel numbers publishes from 1
//     again. Code that maps listener tags to messages would take a later
//     ack under a repeated tag for the message that was lost. Mitigation:
//     correlate through DeferredConfirmation, or treat every tag still
//     mapped as not acked on the channel's Reconnecting→Open transition.
//   - Republishing the moment a confirmation says "not acked" lands inside
//     recovery's reopening of the channel, which upstream does not
//     serialise against publishes: the republish either goes out before
//     confirm.select, so the client's tags run one ahead of the broker's
//     and the last confirmation never comes (a silent drop: Wait without
//     a deadline hangs), or its frames break recovery's handshake and the
//     broker closes the connection (504 or 505), after which recovery
//     retries the channel on the dead connection until its retries run
//     out. Upstream's Reconnect documentation asks callers to wait for
//     StateOpen; the recovery publisher here does (Channel.NotifyStateChange),
//     and with that wait no confirmation is lost or dropped. With safe
//     recovery (drainer mode here, Config.SafeRecovery in default mode)
//     a publish in that window is refused with amqp.ErrChannelRecovering
//     and nothing is sent.
//
// Its tests run under scripts/reliability only; see package
// reliability/internal/level.
package noloss
