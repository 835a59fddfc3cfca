// Package compat is the single switch between amqp091-drainer's read modes.
//
// Code that calls amqp.Dial keeps compiling and keeps behaving as upstream
// amqp091-go. Switching a program to another read mode costs one changed
// line:
//
//	conn, err := amqp.Dial(url)                        // before
//	conn, err := compat.Dial(url, compat.Drainer)      // after
//
// or none, when the mode comes from the environment:
//
//	mode, err := compat.ModeFromEnv() // AMQP091_READ_MODE=drainer
//	conn, err := compat.Dial(url, mode)
//
// A program whose connections are dialled by a library it cannot edit
// needs no compat call at all: amqp091-drainer's amqp.Dial reads
// AMQP091_READ_MODE itself when Config.ReadPath is nil, or takes
// amqp.SetDefaultReadPath's default (see docs/MIGRATING.md).
//
// The modes:
//
//   - Upstream, the zero value: upstream's reader goroutine, unchanged.
//   - Drainer: one goroutine per connection owns the socket read and never
//     blocks on user code (package drainer).
//   - Legacy: caller-drives-read, no background goroutines (package
//     legacyread).
//   - LegacyAutoDrain: legacy plus a goroutine that holds the read turn and
//     reads whenever no caller does (amqp.LegacyOptions.AutoDrain), for code
//     that does not drain.
//
// DialCluster dials a cluster from several URLs in any mode, bounded by a
// context, and gives the connection the same list (amqp.Endpoints) so
// that its automatic recovery moves on to the next node.
package compat

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/drainer"
)

// Mode selects how a connection reads its socket.
type Mode int

// The read modes. Upstream is the zero value.
const (
	Upstream        Mode = iota // upstream's reader goroutine, unchanged
	Legacy                      // caller-drives-read; see package legacyread
	Drainer                     // dedicated drainer; see package drainer
	LegacyAutoDrain             // legacy with amqp.LegacyOptions.AutoDrain set
)

var names = [...]string{Upstream: "upstream", Legacy: "legacy", Drainer: "drainer", LegacyAutoDrain: "legacy-autodrain"}

// String returns "upstream", "legacy", "drainer" or "legacy-autodrain",
// the names ParseMode accepts and Connection.ReadMode reports.
func (m Mode) String() string {
	if m < 0 || int(m) >= len(names) {
		return fmt.Sprintf("Mode(%d)", int(m))
	}
	return names[m]
}

// ParseMode parses a mode name, case-insensitively, ignoring surrounding
// space. Anything else is an error that names the valid values.
func ParseMode(s string) (Mode, error) {
	for m, name := range names {
		if strings.EqualFold(strings.TrimSpace(s), name) {
			return Mode(m), nil
		}
	}
	return Upstream, fmt.Errorf("compat: unknown read mode %q: want one of %s", s, strings.Join(names[:], ", "))
}

// EnvVar is the environment variable ModeFromEnv reads, and the one
// amqp.Dial reads for its process default (amqp.ReadModeEnv).
const EnvVar = amqp.ReadModeEnv

// ModeFromEnv reads the mode from AMQP091_READ_MODE. Unset or empty means
// Upstream; a value ParseMode rejects is an error, never a silent fallback.
//
// It accepts the names of amqp091-drainer's process-wide switch (the same
// variable, read by amqp.Dial when Config.ReadPath is nil), and "legacy"
// too: the switch refuses plain legacy, because a program that never calls
// DrainEvents would hang, but a program that dials with ModeFromEnv's mode
// chose to and can run its drain loop.
func ModeFromEnv() (Mode, error) {
	v := os.Getenv(EnvVar)
	if strings.TrimSpace(v) == "" {
		return Upstream, nil
	}
	m, err := ParseMode(v)
	if err != nil {
		return Upstream, fmt.Errorf("%s: %w", EnvVar, err)
	}
	return m, nil
}

// Option tunes a mode without changing the one-option form of Dial, or
// DialCluster (WithOrder, WithEndpointTLS, WithConfig, WithBackoff,
// WithMaxAttempts, WithAttemptTimeout, WithDialer, WithLogger).
type Option func(*options)

type options struct {
	drainer amqp.DrainerOptions
	legacy  amqp.LegacyOptions
	cluster cluster // DialCluster's options (cluster.go)
	// blocking: sockets read with blocking system calls (WithBlockingRead)
	blocking bool
}

// WithDrainerOptions tunes drainer mode (budget, close timeout). Other
// modes ignore it.
func WithDrainerOptions(o amqp.DrainerOptions) Option {
	return func(opts *options) { opts.drainer = o }
}

// WithLegacyOptions tunes legacy mode, and LegacyAutoDrain (which sets
// AutoDrain whatever o says). Other modes ignore it.
func WithLegacyOptions(o amqp.LegacyOptions) Option {
	return func(opts *options) { opts.legacy = o }
}

// WithBlockingRead reads the connection's socket with blocking system calls on the
// reading goroutine's thread instead of through Go's network poller (see
// drainer.BlockingDialer: it costs an OS thread per connection, and pays where a few
// connections carry many messages). Every Dial function of this package honours it, and
// the connection's recoveries too. Drainer and Upstream modes only: legacy modes cut a
// read short for every write, which a blocked read(2) does not allow, and refuse it.
func WithBlockingRead() Option {
	return func(o *options) { o.blocking = true }
}

// ReadPath returns the amqp.Config.ReadPath of mode. For Upstream it is
// amqp.Upstream(), not nil, so that an explicit choice of upstream's reader
// holds whatever process default (amqp.SetDefaultReadPath,
// AMQP091_READ_MODE) is set.
func ReadPath(mode Mode, opts ...Option) (amqp.ReadPath, error) {
	o := collect(opts)
	if o.blocking && (mode == Legacy || mode == LegacyAutoDrain) {
		return nil, fmt.Errorf("compat: WithBlockingRead needs the drainer or upstream mode, not %v: "+
			"legacy cuts a read short for each write, which a blocked read(2) does not allow", mode)
	}
	switch mode {
	case Upstream:
		return amqp.Upstream(), nil
	case Legacy:
		return amqp.Legacy(o.legacy), nil
	case LegacyAutoDrain:
		l := o.legacy
		l.AutoDrain = true
		return amqp.Legacy(l), nil
	case Drainer:
		return amqp.Drainer(o.drainer), nil
	default:
		return nil, fmt.Errorf("compat: unknown read mode %v", mode)
	}
}

// Dial is amqp.Dial in the given read mode.
func Dial(url string, mode Mode, opts ...Option) (*amqp.Connection, error) {
	return DialConfig(url, amqp.Config{}, mode, opts...)
}

// DialTLS is amqp.DialTLS in the given read mode.
func DialTLS(url string, amqps *tls.Config, mode Mode, opts ...Option) (*amqp.Connection, error) {
	return DialConfig(url, amqp.Config{TLSClientConfig: amqps}, mode, opts...)
}

// DialConfig is amqp.DialConfig in the given read mode. Every setting of
// cfg is honoured as upstream honours it, recovery included; the mode
// replaces whatever cfg.ReadPath held.
func DialConfig(url string, cfg amqp.Config, mode Mode, opts ...Option) (*amqp.Connection, error) {
	rp, err := ReadPath(mode, opts...)
	if err != nil {
		return nil, err
	}
	cfg.ReadPath = rp
	if collect(opts).blocking {
		timeout := upstreamConnectionTimeout // the handshake's bound, as amqp.DialConfig's
		if uri, err := amqp.ParseURI(url); err == nil && uri.ConnectionTimeout > 0 {
			timeout = time.Duration(uri.ConnectionTimeout) * time.Millisecond
		}
		cfg.Dial = drainer.BlockingDialer(cfg.Dial, timeout)
	}
	return amqp.DialConfig(url, cfg)
}

// collect applies opts to a zero options.
func collect(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// blockingDial is dial, whose sockets are read with blocking system calls
// (WithBlockingRead); timeout is the handshake's bound until the caller sets its own.
func blockingDial(dial DialFunc, timeout time.Duration) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return drainer.BlockingConn(conn, timeout)
	}
}
