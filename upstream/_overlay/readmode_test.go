// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestParseReadModeEnv: every value AMQP091_READ_MODE accepts, and the two
// kinds of refusal, each naming the variable and what to do instead.
func TestParseReadModeEnv(t *testing.T) {
	for in, want := range map[string]string{
		"": "upstream", "  ": "upstream", "upstream": "upstream", "UPSTREAM": "upstream",
		"drainer": "drainer", " Drainer ": "drainer",
		"legacy-autodrain": "legacy-autodrain", "Legacy-AutoDrain": "legacy-autodrain",
	} {
		rp, err := parseReadModeEnv(in)
		if err != nil {
			t.Errorf("parseReadModeEnv(%q) = %v", in, err)
			continue
		}
		got := "upstream"
		if rp != nil {
			got = rp.Mode()
		}
		if got != want {
			t.Errorf("parseReadModeEnv(%q) = %q, want %q", in, got, want)
		}
	}
	for _, legacy := range []string{"legacy", " LEGACY "} {
		_, err := parseReadModeEnv(legacy)
		if !errors.Is(err, ErrInvalidReadMode) {
			t.Fatalf("parseReadModeEnv(%q) = %v, want ErrInvalidReadMode", legacy, err)
		}
		for _, part := range []string{ReadModeEnv, "DrainEvents", "hang", "legacy-autodrain", "Config.ReadPath"} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("the refusal of %q does not say %q: %v", legacy, part, err)
			}
		}
	}
	for _, bad := range []string{"drain", "legacy_autodrain", "seam-probe", "1"} {
		_, err := parseReadModeEnv(bad)
		if !errors.Is(err, ErrInvalidReadMode) {
			t.Fatalf("parseReadModeEnv(%q) = %v, want ErrInvalidReadMode", bad, err)
		}
		for _, part := range []string{ReadModeEnv, `"drainer"`, `"legacy-autodrain"`, `"upstream"`} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("the error for %q does not name %s: %v", bad, part, err)
			}
		}
	}
}

// TestReadPathSourcesOrder: Config.ReadPath, then SetDefaultReadPath, then
// the mode a test forces, then AMQP091_READ_MODE.
func TestReadPathSourcesOrder(t *testing.T) {
	drainer, legacy, probe := Drainer(DrainerOptions{}), Legacy(LegacyOptions{}), ReadPath(seamProbe{})
	envErr := errors.New("env consulted")
	env := func(rp ReadPath) func() (ReadPath, error) {
		return func() (ReadPath, error) { return rp, nil }
	}
	mode := func(rp ReadPath, err error) string {
		switch {
		case err != nil:
			return "error: " + err.Error()
		case rp == nil:
			return "upstream"
		}
		return rp.Mode()
	}
	for _, tc := range []struct {
		name string
		cfg  ReadPath
		src  readPathSources
		want string
	}{
		{"nothing set", nil, readPathSources{env: env(nil)}, "upstream"},
		{"env", nil, readPathSources{env: env(drainer)}, "drainer"},
		{"env error", nil, readPathSources{env: func() (ReadPath, error) { return nil, envErr }}, "error: env consulted"},
		{"forced upstream beats env", nil, readPathSources{forced: true, env: env(drainer)}, "upstream"},
		{"forced beats env", nil, readPathSources{forced: true, forcedPath: probe, env: env(drainer)}, "seam-probe"},
		{"programmatic beats forced", nil, readPathSources{programmatic: &legacy, forced: true, forcedPath: probe, env: env(drainer)}, "legacy"},
		{"programmatic beats a bad env", nil, readPathSources{programmatic: &drainer, env: func() (ReadPath, error) { return nil, envErr }}, "drainer"},
		{"config beats all", probe, readPathSources{programmatic: &legacy, forced: true, forcedPath: drainer, env: env(drainer)}, "seam-probe"},
		{"explicit upstream beats all", Upstream(), readPathSources{programmatic: &legacy, env: env(drainer)}, "upstream"},
	} {
		rp, err := tc.src.resolve(tc.cfg)
		if got := mode(rp, err); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestSetDefaultReadPath opens connections over a pipe with a programmatic
// default set: a connection without Config.ReadPath takes it, one with
// Upstream() stays upstream's, and clearing the default restores the
// suite's own mode. No goroutine of theirs outlives the connections.
func TestSetDefaultReadPath(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	before := programmaticReadPath.Load()
	defer programmaticReadPath.Store(before)

	var conns []*Connection
	defer func() { // before goleak looks
		for _, c := range conns {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	}()
	open := func(cfg Config) *Connection {
		t.Helper()
		rwc, srv := newSession(t)
		go func() {
			srv.connectionOpen()
			srv.connectionClose()
		}()
		c, err := Open(rwc, cfg)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		conns = append(conns, c)
		return c
	}
	SetDefaultReadPath(seamProbe{})
	if got := open(defaultConfig()).ReadMode(); got != "seam-probe" {
		t.Fatalf("with SetDefaultReadPath(seamProbe{}): ReadMode() = %q", got)
	}
	cfg := defaultConfig()
	cfg.ReadPath = Upstream()
	if got := open(cfg).ReadMode(); got != "upstream" {
		t.Fatalf("Config.ReadPath = Upstream(): ReadMode() = %q", got)
	}
	SetDefaultReadPath(nil)
	rp, err := resolveReadPath(nil)
	if err != nil {
		t.Skipf("the process default is invalid here: %v", err)
	}
	want := "upstream"
	if rp != nil {
		want = rp.Mode()
	}
	if got := open(defaultConfig()).ReadMode(); got != want {
		t.Fatalf("after SetDefaultReadPath(nil): ReadMode() = %q, want the suite's %q", got, want)
	}
}
