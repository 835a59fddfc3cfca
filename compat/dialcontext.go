package compat

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// upstreamConnectionTimeout is amqp091-go's defaultConnectionTimeout
// (unexported): the bound of DialConfig's handshake when the URL has no
// connection_timeout, and of every dial of its automatic recovery when
// Config.Dial is nil. DialContext keeps both, so that a context without a
// deadline is never less bounded than amqp.DialConfig.
const upstreamConnectionTimeout = 30 * time.Second

// DialContext is Dial bounded by ctx: amqp.Dial in the given read mode,
// except that ctx bounds the TCP connect, the TLS handshake (amqps URLs)
// and the AMQP handshake.
//
// Upstream's Dial bounds its handshake with a fixed 30 s deadline, or the
// URL's connection_timeout, and cannot be cancelled: a caller with a
// deadline of its own, or one that is shutting down, has to wait that out
// against a broker that accepts connections and never answers (a stopped
// VM behind a load balancer, a blackholed network). DialContext returns
// instead, well within 100 ms of ctx's end, with an error for which
// errors.Is(err, ctx.Err()) holds; it closes the socket and leaves no
// goroutine behind. The error names, as text, what the handshake saw, but
// does not wrap it: upstream turns any failure after start-ok into
// amqp.ErrCredentials, which a timeout must not be mistaken for.
//
// The upstream bound still applies as well, so that a ctx without a
// deadline is bounded as amqp.Dial is: when it expires first, the error
// says "not connected within" and wraps os.ErrDeadlineExceeded.
//
// ctx bounds only the dial: once DialContext has returned a connection,
// ending ctx has no effect on it, nor on its automatic recovery (whose
// dials are bounded as upstream bounds them). Contexts are for calls, and
// a connection outlives the call that opened it; close it with Close.
//
// A failure unrelated to ctx (a refused connect, a bad password) returns
// the same error as amqp.Dial. WithDialer replaces the net.Dialer, for the
// dial and the recoveries; the other DialCluster options are ignored.
func DialContext(ctx context.Context, url string, mode Mode, opts ...Option) (*amqp.Connection, error) {
	return dialContext(ctx, "DialContext", url, amqp.Config{}, mode, opts)
}

// DialTLSContext is DialTLS bounded by ctx: amqp.DialTLS in the given read
// mode, with ctx bounding the TCP connect, the TLS handshake and the AMQP
// handshake, as DialContext describes. A TLS handshake with a peer that
// never answers the ClientHello ends when ctx does.
//
// amqps is cloned, not modified: upstream's DialTLS fills in an empty
// ServerName on the caller's tls.Config, which races when one config is
// shared by concurrent dials.
func DialTLSContext(ctx context.Context, url string, amqps *tls.Config, mode Mode, opts ...Option) (*amqp.Connection, error) {
	return dialContext(ctx, "DialTLSContext", url, amqp.Config{TLSClientConfig: amqps}, mode, opts)
}

// DialConfigContext is DialConfig bounded by ctx: amqp.DialConfig in the
// given read mode, with ctx bounding the TCP connect, the TLS handshake
// and the AMQP handshake, as DialContext describes. Every setting of cfg
// is honoured as DialConfig honours it, recovery included, except:
//
//   - ReadPath is replaced by the mode's, as DialConfig does;
//   - Dial must be nil, or DialConfigContext returns an error without
//     dialling. A Config.Dial takes no context, so ctx could neither stop
//     its connect nor wait for it without leaving a goroutine behind. Give
//     a dialer that takes a context with WithDialer instead; it is used
//     for the recoveries too;
//   - TLSClientConfig and Properties are cloned, not modified.
func DialConfigContext(ctx context.Context, url string, cfg amqp.Config, mode Mode, opts ...Option) (*amqp.Connection, error) {
	return dialContext(ctx, "DialConfigContext", url, cfg, mode, opts)
}

// dialContext is the three Dial*Context functions; fn names the one called,
// for errors.
func dialContext(ctx context.Context, fn, url string, cfg amqp.Config, mode Mode, opts []Option) (*amqp.Connection, error) {
	if ctx == nil {
		return nil, fmt.Errorf("compat: %s: nil context", fn)
	}
	o := collect(opts)
	rp, err := ReadPath(mode, opts...)
	if err != nil {
		return nil, err
	}
	if cfg.Dial != nil {
		return nil, fmt.Errorf("compat: %s: Config.Dial cannot be bounded by a context: give the dialer with WithDialer (it takes one)", fn)
	}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return nil, err // as amqp.DialConfig returns it
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("compat: %s %s: %w before dialling", fn, redact(url), err)
	}
	timeout := upstreamConnectionTimeout // the handshake's bound in amqp.DialConfig
	if uri.ConnectionTimeout != 0 {
		timeout = time.Duration(uri.ConnectionTimeout) * time.Millisecond
	}
	dial := o.cluster.dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	if o.blocking {
		dial = blockingDial(dial, timeout)
	}
	cfg.ReadPath = rp
	cfg.TLSClientConfig = cfg.TLSClientConfig.Clone()
	cfg.Properties = maps.Clone(cfg.Properties)

	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := handshake(actx, url, cfg, dial, upstreamConnectionTimeout)
	if err == nil {
		return conn, nil
	}
	if ctxEnded(actx) == nil {
		return nil, err // not a matter of time: as amqp.DialConfig returns it
	}
	// The handshake's own error is text only, not wrapped: upstream reports
	// a socket that timed out or was closed after start-ok as
	// amqp.ErrCredentials, and a caller that gives up on bad credentials
	// must not see them in a network timeout.
	if cerr := ctxEnded(ctx); cerr != nil {
		if err == cerr {
			return nil, fmt.Errorf("compat: %s %s: %w", fn, redact(url), cerr)
		}
		return nil, fmt.Errorf("compat: %s %s: %w (the handshake: %v)", fn, redact(url), cerr, err)
	}
	return nil, fmt.Errorf("compat: %s %s: not connected within %v, amqp.DialConfig's handshake bound: %w (the handshake: %v)",
		fn, redact(url), timeout, os.ErrDeadlineExceeded, err)
}

// ctxEnded returns ctx.Err(), waiting for it when ctx's deadline has passed
// but ctx is not yet done. The socket's deadline is ctx's (phaseDialer),
// and an I/O timeout may be seen a moment before ctx's own timer has
// fired; the wait is that moment, and the caller gets an error that Is
// ctx.Err() instead of a bare i/o timeout.
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}
