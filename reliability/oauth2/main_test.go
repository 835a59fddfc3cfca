package oauth2

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/oauthnode"
	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

// TestMain checks for leaked goroutines after the tests, once the shared
// node (registered with testenv.AtExit) has stopped.
func TestMain(m *testing.M) { testenv.Main(m) }

var shared struct {
	once sync.Once
	n    *oauthnode.Node
	err  error
}

// node skips t unless the reliability suite is enabled and the machine can
// run an OAuth 2 node, and returns the package's node, booting it on first
// use; it stops when the test binary ends.
func node(t *testing.T) (*oauthnode.Node, level.Level) {
	t.Helper()
	lvl := level.Require(t)
	if ok, why := oauthnode.Usable(); !ok {
		t.Skip("skipped: " + why)
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		o := oauthnode.Options{}
		if testing.Verbose() {
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
		t0 := time.Now()
		shared.n, shared.err = oauthnode.Start(ctx, o)
		if shared.err != nil {
			return
		}
		t.Logf("OAuth 2 node up in %v at %s, files in %s",
			time.Since(t0).Round(100*time.Millisecond), shared.n.URL(), shared.n.Dir())
		n := shared.n
		if err := testenv.AtExit(func() {
			if err := n.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "stopping the OAuth 2 node: %v\n", err)
			}
		}); err != nil {
			_ = n.Stop()
			shared.err = err
		}
	})
	if shared.err != nil {
		t.Fatalf("starting the OAuth 2 node: %v", shared.err)
	}
	return shared.n, lvl
}
