// Package oauth2 measures what RabbitMQ 3.10.8 does when the OAuth 2 token
// of an open AMQP 0-9-1 connection expires, and what
// connection.update-secret does (issue #41), with the plain upstream API,
// then proves the refresh of expiring credentials (amqp.ExpiringAuth,
// TestRefresh: refresh_test.go says what it runs) against a node of its own (internal/oauthnode: the machine's RabbitMQ
// install with rabbitmq_auth_backend_oauth2 as its only backend, in a
// network namespace; it needs root and skips with the reason elsewhere).
// TestBrokerOnTokenExpiry logs each observation with its time relative to
// the token's expiry (or the update), in five scenarios run in parallel
// (-parallel 5 runs them all at once):
//
//   - a: the token expires and is never replaced;
//   - b: update-secret with a valid token at half the first one's life;
//   - c: update-secret with a valid token one lifetime after expiry;
//   - d: update-secret with an expired token, one signed with another key,
//     and a string that is no JWT;
//   - e: update-secret with a token whose scopes no longer allow writing
//     to the exchange the connection publishes to.
//
// It asserts only what a token refresher relies on: b's update is
// accepted and nothing fails past the first token's expiry. What 3.10.8
// did (measured 2026-12-07, tokens of 10 s, 75 s watched):
//
//  1. The broker never closes a connection whose token expired, and never
//     refuses channel.open. The backend checks exp (in whole seconds) on
//     every check it is asked for; an expired token fails each with a
//     channel exception, 403 ACCESS_REFUSED "access to exchange|queue
//     'NAME' in vhost '/' refused for user 'SUB', backend
//     rabbit_auth_backend_oauth2 returned an error: "Provided JWT token has
//     expired at timestamp EXP (validated at NOW)"" (the reply text is cut
//     at 255 bytes; the broker's log has it whole).
//  2. But each channel caches its successful checks (the last 12) and
//     forgets them only on its tick, 60 s after it opened and every 60 s
//     after (channel_tick_interval), or when it hibernates after 1 to 10 s
//     without a message. So an open channel that keeps publishing to the
//     same exchange, or getting from the same queue, goes on until its
//     tick (49 s after expiry here); one that sat idle fails at its first
//     operation after expiry; a new channel, a new queue or an exchange the
//     channel never published to fails at once.
//  3. A consumer's deliveries and its acks are never checked: they went on
//     for the whole 75 s after expiry.
//  4. update-secret with a valid token is accepted within milliseconds,
//     before or after expiry; after expiry, what failed works again at
//     once. It swaps the channels' user but not their caches.
//  5. update-secret checks the token's signature and audience, but not its
//     exp: an expired, well-signed token is accepted (update-ok),
//     and the next uncached check fails as in 1. A bad signature or a
//     malformed token closes the connection: 530 NOT_ALLOWED "New secret
//     was refused by one of the backends" (the reason, signature_invalid
//     or "provided token is invalid", is only in the broker's log).
//  6. Narrower scopes take effect as in 2: new channels are refused at
//     once (403 ACCESS_REFUSED "access to exchange 'NAME' in vhost '/'
//     refused for user 'SUB'", with no backend error), a busy channel
//     keeps publishing until its tick (60 s), an idle one fails at its
//     next publish.
//
// A plain go test ./... skips it; AMQP091_RELIABILITY=short (make test)
// runs only scenario d of TestBrokerOnTokenExpiry and TestRefresh with
// tokens of 4 s; full (make reliability) watches tokens of 10 s for 75 s,
// past the channel tick, and runs TestRefresh with tokens of 10 s.
package oauth2
