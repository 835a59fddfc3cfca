// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// The process-wide read-mode switch.
//
// A program that dials through a library it cannot edit (watermill,
// gocloud, ...) never sets Config.ReadPath. For such programs a connection
// whose Config.ReadPath is nil takes a process default, resolved once per
// connection, in Open (which Dial, DialConfig and DialTLS call), and kept
// by every recovery generation of that connection. In order of precedence:
//
//  1. Config.ReadPath, when it is not nil (Upstream() asks for upstream's
//     reader explicitly, whatever the defaults say);
//  2. the programmatic default, SetDefaultReadPath;
//  3. the mode that this package's own tests force on upstream's suite
//     (the test-only defaultReadPath, set by an _test.go file; never in a
//     production build);
//  4. the environment variable AMQP091_READ_MODE, read once per process;
//  5. upstream's reader goroutine.
//
// Code beats the environment, so that a program that chose a mode keeps
// it; the forced test mode beats the environment too, so that a variable
// left in a shell cannot change what upstream's suite runs in.

// ReadModeEnv is the environment variable that chooses the read mode of
// connections dialled with no Config.ReadPath when no programmatic default
// is set. Its values: unset, empty or "upstream" (upstream's reader),
// "drainer" (Drainer with zero options), "legacy-autodrain" (Legacy with
// AutoDrain). "legacy" is refused: see ErrInvalidReadMode.
const ReadModeEnv = "AMQP091_READ_MODE"

// ErrInvalidReadMode is wrapped by the error that Open and Dial return,
// for a connection with no Config.ReadPath and no SetDefaultReadPath,
// while AMQP091_READ_MODE holds a value the process switch does not
// accept: a typo, or "legacy", which would leave a program that never
// calls DrainEvents waiting forever for its deliveries and confirms. The
// connection is never opened in some other mode instead.
var ErrInvalidReadMode = errors.New("amqp: invalid read mode")

// SetDefaultReadPath sets the read path of every connection opened after
// it whose Config.ReadPath is nil, in this process; nil clears it, so that
// AMQP091_READ_MODE (or upstream's reader) applies again. Call it early in
// main, before any library dials: a connection keeps the read path it was
// opened with, through every recovery, whatever is set later.
//
//	amqp.SetDefaultReadPath(amqp.Drainer(amqp.DrainerOptions{}))
func SetDefaultReadPath(rp ReadPath) {
	if rp == nil {
		programmaticReadPath.Store(nil)
		return
	}
	programmaticReadPath.Store(&rp)
}

// programmaticReadPath is SetDefaultReadPath's value; a pointer because
// atomic.Pointer cannot hold an interface directly.
var programmaticReadPath atomic.Pointer[ReadPath]

// defaultReadPathForced says that a test-only file has forced
// defaultReadPath (readpath.go) on this package's tests, upstream's suite
// included, even to nil: then AMQP091_READ_MODE is not consulted.
var defaultReadPathForced bool

// Upstream returns the ReadPath of upstream's own reader goroutine and
// heartbeater. Setting it as Config.ReadPath is the same as leaving the
// field nil, except that no process default (SetDefaultReadPath,
// AMQP091_READ_MODE) applies: the connection is upstream's, explicitly.
func Upstream() ReadPath { return upstreamMode{} }

// upstreamMode is Upstream's ReadPath: it attaches no read path.
type upstreamMode struct{}

func (upstreamMode) Mode() string                { return "upstream" }
func (upstreamMode) attach(*Connection) readPath { return nil }

// envReadPath is AMQP091_READ_MODE's read path, parsed the first time a
// connection needs it, so that a program sees one mode for its whole life.
var envReadPath = sync.OnceValues(func() (ReadPath, error) {
	return parseReadModeEnv(os.Getenv(ReadModeEnv))
})

// readModeEnvValues lists what AMQP091_READ_MODE accepts, for errors.
const readModeEnvValues = `"upstream" (or unset or empty), "drainer", "legacy-autodrain"`

// parseReadModeEnv turns AMQP091_READ_MODE's value into a read path: nil
// for upstream. Case and surrounding space are ignored, as
// compat.ParseMode ignores them.
func parseReadModeEnv(v string) (ReadPath, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "upstream":
		return nil, nil
	case "drainer":
		return Drainer(DrainerOptions{}), nil
	case "legacy-autodrain":
		return Legacy(LegacyOptions{AutoDrain: true}), nil
	case "legacy":
		return nil, fmt.Errorf("%w: %s=%q is refused: in plain legacy mode deliveries, confirms and heartbeats "+
			"wait for the program to call Connection.DrainEvents, so a program that does not would hang; "+
			"set %s=legacy-autodrain, or set Config.ReadPath = amqp.Legacy(...) in code that runs a drain loop",
			ErrInvalidReadMode, ReadModeEnv, v, ReadModeEnv)
	default:
		return nil, fmt.Errorf("%w: %s=%q: want one of %s", ErrInvalidReadMode, ReadModeEnv, v, readModeEnvValues)
	}
}

// resolveReadPath is the read path of a connection opened with cfg, in the
// order of precedence above.
func resolveReadPath(cfg ReadPath) (ReadPath, error) {
	return readPathSources{
		programmatic: programmaticReadPath.Load(),
		forced:       defaultReadPathForced || defaultReadPath != nil,
		forcedPath:   defaultReadPath,
		env:          envReadPath,
	}.resolve(cfg)
}

// readPathSources are the places a connection's read path can come from,
// apart from its Config, so that tests can check the order without
// changing the process's own.
type readPathSources struct {
	programmatic *ReadPath                // SetDefaultReadPath, nil when unset
	forced       bool                     // a test file forced forcedPath
	forcedPath   ReadPath                 // nil: upstream
	env          func() (ReadPath, error) // AMQP091_READ_MODE
}

// resolve picks cfg's read path from s, in the order of precedence above.
func (s readPathSources) resolve(cfg ReadPath) (ReadPath, error) {
	switch {
	case cfg != nil:
		return cfg, nil
	case s.programmatic != nil:
		return *s.programmatic, nil
	case s.forced:
		return s.forcedPath, nil
	default:
		return s.env()
	}
}

// startAndOpen is Open's hook: it resolves the connection's read path,
// starts the first generation's reader and runs upstream's handshake
// (c.open), asking Config.Credentials first (credentials.go). When the
// process default is invalid or the provider fails, it opens nothing: it
// closes conn, as upstream's failed opens leave their socket closed, marks
// the connection closed, and returns the error.
func (c *Connection) startAndOpen(conn io.ReadWriteCloser, config Config) error {
	rp, err := resolveReadPath(c.Config.ReadPath)
	if err != nil {
		c.closed.Store(true)
		_ = conn.Close()
		return err
	}
	if err := c.openCredentials(&config); err != nil {
		c.closed.Store(true)
		_ = conn.Close()
		return err
	}
	if rp != nil {
		// Open calls this before c escapes to another goroutine, and
		// Reconnect reuses c.rp, so no lock is needed.
		c.rp = rp.attach(c)
	}
	c.startReader(conn)
	if config.Credentials != nil {
		return loginError(c.open(config), c.endpoint(), config.SASL)
	}
	return c.open(config)
}
