//go:build !pristine

package readmode

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
)

// Build names the build this binary was compiled against.
const Build = "patched"

// Modes lists the read modes this build offers.
func Modes() []string { return []string{Upstream, Legacy, Drainer} }

// DialConfig dials url with cfg in the named read mode.
func DialConfig(url string, cfg amqp.Config, mode string) (*amqp.Connection, error) {
	var opts []compat.Option
	if mode == DrainerBlocking {
		mode = Drainer
		opts = append(opts, compat.WithBlockingRead())
	}
	m, err := compat.ParseMode(mode)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if os.Getenv(CoalesceEnv) == "1" {
		opts = append(opts, compat.WithDrainerOptions(amqp.DrainerOptions{CoalescePublishes: true}),
			compat.WithLegacyOptions(amqp.LegacyOptions{CoalescePublishes: true}))
	}
	return compat.DialConfig(url, cfg, m, opts...)
}

// DrainEvents reads and dispatches frames until at least one arrived or ctx
// ends, as the patched Connection.DrainEvents does in every mode. Legacy
// mode needs a caller in it for anything to be delivered; in the other
// modes a background goroutine reads and it only waits.
func DrainEvents(ctx context.Context, conn *amqp.Connection) error {
	return conn.DrainEvents(ctx)
}

// ReadMode reports the read mode conn runs in.
func ReadMode(conn *amqp.Connection) string { return conn.ReadMode() }

// Pooled reports whether ConsumeFunc recycles bodies in this build.
const Pooled = true

// ConsumeFunc consumes queue through amqp.Channel.ConsumeFunc, whose
// bodies come from a pool and are valid only inside handler, until ctx
// ends or the consumption fails.
func ConsumeFunc(ctx context.Context, ch *amqp.Channel, queue string, autoAck bool, handler func(*amqp.Delivery) error) error {
	return ch.ConsumeFunc(ctx, queue, amqp.ConsumeFuncOptions{AutoAck: autoAck}, handler)
}

// DialDrainer dials url with cfg in drainer mode, with the given read
// budget and a Logger for the drainer's warnings.
func DialDrainer(url string, cfg amqp.Config, budget int64, logger *slog.Logger) (*amqp.Connection, error) {
	return compat.DialConfig(url, cfg, compat.Drainer,
		compat.WithDrainerOptions(amqp.DrainerOptions{Budget: budget, Logger: logger}))
}

// ReadBudget samples conn's read budget and its biggest NotifyPublish
// listener from conn.Stats.
func ReadBudget(conn *amqp.Connection) (BudgetSample, error) {
	s := conn.Stats()
	b := BudgetSample{Limit: s.Budget.Limit, Used: s.Budget.Used, Paused: s.Budget.Paused, Pauses: s.Budget.Pauses}
	for _, l := range s.Listeners {
		if l.Kind == amqp.KindNotifyPublish {
			b.PublishDepth = max(b.PublishDepth, l.Queued)
		}
	}
	return b, nil
}
