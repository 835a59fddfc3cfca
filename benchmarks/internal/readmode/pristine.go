//go:build pristine

package readmode

import (
	"context"
	"fmt"
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Build names the build this binary was compiled against.
const Build = "pristine"

// Modes lists the read modes this build offers.
func Modes() []string { return []string{Upstream} }

// DialConfig dials url with cfg. Upstream is the only mode of this build.
func DialConfig(url string, cfg amqp.Config, mode string) (*amqp.Connection, error) {
	if mode != Upstream && mode != "" {
		return nil, ErrUnsupported
	}
	return amqp.DialConfig(url, cfg)
}

// DrainEvents waits until ctx ends: pristine upstream reads and dispatches
// in its own reader goroutine and offers no call to drive it, so a drain
// loop on this build is a goroutine that waits, as an idle consumer does.
func DrainEvents(ctx context.Context, conn *amqp.Connection) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-conn.NotifyClose(make(chan *amqp.Error, 1)):
		return amqp.ErrClosed
	}
}

// ReadMode reports the read mode conn runs in.
func ReadMode(*amqp.Connection) string { return Upstream }

// Pooled reports whether ConsumeFunc recycles bodies in this build.
const Pooled = false

// ConsumeFunc stands in for the patched build's pooled consumption with
// what pristine upstream offers: a Consume chan, each delivery handed to
// handler, bodies never recycled. It returns when ctx ends (after
// cancelling the consumer) or the deliveries end.
func ConsumeFunc(ctx context.Context, ch *amqp.Channel, queue string, autoAck bool, handler func(*amqp.Delivery) error) error {
	tag := fmt.Sprintf("readmode-%p", ch)
	deliveries, err := ch.Consume(queue, tag, autoAck, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return amqp.ErrClosed
			}
			if err := handler(&d); err != nil {
				return err
			}
		case <-ctx.Done():
			_ = ch.Cancel(tag, false)
			for d := range deliveries {
				_ = handler(&d)
			}
			return ctx.Err()
		}
	}
}

// DialDrainer fails: pristine upstream has no drainer mode.
func DialDrainer(string, amqp.Config, int64, *slog.Logger) (*amqp.Connection, error) {
	return nil, ErrUnsupported
}

// ReadBudget fails: pristine upstream keeps no read budget.
func ReadBudget(*amqp.Connection) (BudgetSample, error) { return BudgetSample{}, ErrUnsupported }
