// Package reliability holds the suites that prove, against a real broker
// and Toxiproxy, that under faults and bad input nothing hangs, nothing
// leaks and nothing is lost, in every read mode. Each subpackage has one
// job:
//
//   - faultmatrix: seven network faults, injected during five phases of a
//     connection's life, in the three read modes; every call returns within
//     a stated bound with the right kind of error, and no goroutine leaks.
//   - brokerfaults: faults the broker itself raises: a forced close, a
//     memory alarm (connection.blocked) and a queue deleted under its
//     consumers.
//   - noloss: publishers with confirms through repeated connection resets,
//     with upstream's automatic recovery and with a user-style retry loop;
//     every positively confirmed message is in the queue afterwards.
//   - connfuzz: the whole patched connection fed mutated frame sequences
//     by a fake peer (go test -fuzz).
//   - soak: a bounded soak in drainer mode (make soak) that reports heap and
//     goroutine counts over time.
//   - listenerorder: for one channel, notifications reach their listeners
//     in frame order across listeners (a return before its ack, a cancel
//     before the deliveries chan closes, flows, blocks), and a close only
//     after everything that came before it, as upstream's reader hands
//     them over (issue #16).
//   - boundedcalls: against a fake peer, every synchronous method's
//     context variant, and the read modes' RPCTimeout, return within their
//     bound when the broker never answers or answers late; the abandoned
//     channel is closed and its late reply discarded, and the connection
//     and its other channels go on (issue #14).
//   - oauth2: what RabbitMQ 3.10.8 does when a connection's OAuth 2 token
//     expires, and what connection.update-secret does, measured on a node
//     of its own (internal/oauthnode; root only) and logged; and the
//     refresh of expiring credentials (amqp.ExpiringAuth) in every mode:
//     a control, 6 lifetimes without a reconnect or a loss, scopes
//     narrowed at a refresh, a provider that fails past the expiry
//     (issue #41).
//
// A plain go test ./... skips them (but listenerorder, which declares only
// its own exclusive queues and runs there at its default sizes, and
// boundedcalls, which needs no broker): they load
// the shared broker, and the memory alarm blocks every publisher on it. scripts/reliability runs them
// one package at a time, short (make test) or full (make reliability); see
// package level.
package reliability
