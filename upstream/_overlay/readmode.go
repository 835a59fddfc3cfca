// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

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

// ReadModeEnv, read once per process, chooses the read mode of connections with no Config.ReadPath
// when SetDefaultReadPath set none: unset, empty or "upstream" (upstream's reader), "drainer"
// (Drainer, zero options) or "legacy-autodrain" (Legacy with AutoDrain); see ErrInvalidReadMode.
const ReadModeEnv = "AMQP091_READ_MODE"

// ErrInvalidReadMode is wrapped by the error Open and Dial return, opening nothing, when
// AMQP091_READ_MODE applies and holds another value: a typo, or "legacy", under which a program
// that never calls DrainEvents would wait forever for deliveries and confirms.
var ErrInvalidReadMode = errors.New("amqp: invalid read mode")

// SetDefaultReadPath sets, ahead of AMQP091_READ_MODE, the read path of connections opened later
// with a nil Config.ReadPath; nil clears it. Call it early: a connection keeps its read path.
//
//	amqp.SetDefaultReadPath(amqp.Drainer(amqp.DrainerOptions{}))
func SetDefaultReadPath(rp ReadPath) {
	if rp == nil {
		programmaticReadPath.Store(nil)
		return
	}
	programmaticReadPath.Store(&rp)
}

// programmaticReadPath: SetDefaultReadPath's (atomic holds no interface).
var programmaticReadPath atomic.Pointer[ReadPath]

// defaultReadPathForced: a test forced defaultReadPath (readpath.go), even nil.
var defaultReadPathForced bool

// Upstream returns the ReadPath of upstream's reader goroutine and heartbeater. As Config.ReadPath
// it acts as nil, but no process default (SetDefaultReadPath, AMQP091_READ_MODE) overrides it.
func Upstream() ReadPath { return upstreamMode{} }

type upstreamMode struct{} // attaches no read path

func (upstreamMode) Mode() string                { return "upstream" }
func (upstreamMode) attach(*Connection) readPath { return nil }

// envReadPath is parsed once, so that a program sees one mode all its life.
var envReadPath = sync.OnceValues(func() (ReadPath, error) {
	return parseReadModeEnv(os.Getenv(ReadModeEnv))
})

// parseReadModeEnv ignores case and space as compat.ParseMode does.
func parseReadModeEnv(v string) (ReadPath, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "upstream":
		return nil, nil
	case "drainer":
		return Drainer(DrainerOptions{}), nil
	case "legacy-autodrain":
		return Legacy(LegacyOptions{AutoDrain: true}), nil
	case "legacy":
		return nil, fmt.Errorf("%w: %s=%q is refused: in plain legacy mode deliveries, "+
			"confirms and heartbeats wait for the program to call Connection.DrainEvents, "+
			"so a program that does not would hang; set %s=legacy-autodrain, or set "+
			"Config.ReadPath = amqp.Legacy(...) in code that runs a drain loop",
			ErrInvalidReadMode, ReadModeEnv, v, ReadModeEnv)
	default:
		return nil, fmt.Errorf(`%w: %s=%q: want one of "upstream" (or unset or empty), `+
			`"drainer", "legacy-autodrain"`, ErrInvalidReadMode, ReadModeEnv, v)
	}
}

// resolveReadPath is the read path of a connection opened with cfg.
func resolveReadPath(cfg ReadPath) (ReadPath, error) {
	return readPathSources{
		programmatic: programmaticReadPath.Load(),
		forced:       defaultReadPathForced || defaultReadPath != nil,
		forcedPath:   defaultReadPath,
		env:          envReadPath,
	}.resolve(cfg)
}

// readPathSources: where else a read path comes from (tests fake them).
type readPathSources struct {
	programmatic *ReadPath                // SetDefaultReadPath, nil when unset
	forced       bool                     // a test file forced forcedPath
	forcedPath   ReadPath                 // nil: upstream
	env          func() (ReadPath, error) // AMQP091_READ_MODE
}

// resolve picks, first found: cfg, SetDefaultReadPath, a test file's forced mode,
// AMQP091_READ_MODE, then upstream. The option in code wins over anything the process
// sets, so that a library that chose a mode keeps it.
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

// startAndOpen is Open's hook: read path, credentials, reader, c.open, in that order. An
// early failure closes c, as upstream's Open does when its handshake fails.
func (c *Connection) startAndOpen(conn io.ReadWriteCloser, config Config) error {
	rp, err := resolveReadPath(c.Config.ReadPath)
	if err == nil {
		err = c.openCredentials(&config)
	}
	if err != nil {
		c.closed.Store(true)
		_ = conn.Close()
		return err
	}
	if rp != nil {
		c.rp = rp.attach(c) // c has not escaped; Reconnect reuses c.rp
	}
	c.startReader(conn)
	if config.Credentials != nil {
		return loginError(c.open(config), c.endpoint(), config.SASL)
	}
	return c.open(config)
}
