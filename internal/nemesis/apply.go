package nemesis

import (
	"context"
	"errors"
	"fmt"

	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	"github.com/amqp091-drainer/amqp091-drainer/internal/clusterfaults"
)

// Hooks inject the client faults, which act on the workload rather than
// on the cluster: its link cut, its process frozen. Each returns what
// undoes it. A nil hook makes its kind fail to apply.
type Hooks struct {
	CutClientLink func(ctx context.Context, client string) (restore func() error, err error)
	FreezeClient  func(ctx context.Context, client string) (thaw func() error, err error)
}

// Heal undoes an applied action, and returns a note of what it took
// beyond the undoing (a node's app restarted after a recorded partition).
type Heal func(ctx context.Context) (note string, err error)

// Apply injects a on c now, and returns what heals it. A node fault's
// heal waits until the three nodes run again; one that cut nodes off or
// froze one also restarts the app of a node whose peers still record a
// partition, as RabbitMQ's default ignore handling needs
// (clusterfaults.HealAndRejoin). Every action can run alone this way.
func Apply(ctx context.Context, c *cluster.Cluster, a Action, h Hooks) (Heal, error) {
	if k := a.Kind; k == ClientLink || k == FreezeClient {
		return applyClient(ctx, a, h)
	}
	inject, heal, err := nodeFault(c, a)
	if err == nil {
		err = inject(ctx)
	}
	if err != nil {
		return nil, err
	}
	return heal, nil
}

// nodeFault is what injects node fault a on c, and what heals it.
func nodeFault(c *cluster.Cluster, a Action) (inject func(context.Context) error, heal Heal, err error) {
	want := 1
	if a.Kind == Bridge {
		want = 2
	}
	if len(a.Nodes) != want {
		return nil, nil, fmt.Errorf("nemesis: %s needs %d nodes, got %v", a.Kind, want, a.Nodes)
	}
	n := a.Nodes[0]
	rejoin := func(ctx context.Context) (string, error) { return clusterfaults.HealAndRejoin(ctx, c, n) }
	switch a.Kind {
	case Kill:
		return func(context.Context) error { return c.Kill(n) },
			running(c, func(ctx context.Context) error { return c.Restart(ctx, n) }), nil
	case StopApp:
		return func(ctx context.Context) error { return c.StopApp(ctx, n) },
			running(c, func(ctx context.Context) error { return c.StartApp(ctx, n) }), nil
	case Partition:
		return func(context.Context) error { return c.Partition(n, cluster.CutPeers) }, rejoin, nil
	case Bridge:
		return func(context.Context) error { return c.CutBetween(n, a.Nodes[1]) }, rejoin, nil
	case FreezeNode:
		thaw := func(ctx context.Context) (string, error) {
			if err := c.Thaw(n); err != nil {
				return "", err
			}
			return rejoin(ctx)
		}
		return func(context.Context) error { return c.Freeze(n) }, thaw, nil
	}
	return nil, nil, fmt.Errorf("nemesis: unknown fault kind %q", a.Kind)
}

// running is the heal that undoes a fault with undo, then waits until the
// three nodes run.
func running(c *cluster.Cluster, undo func(context.Context) error) Heal {
	return func(ctx context.Context) (string, error) {
		if err := undo(ctx); err != nil {
			return "", err
		}
		return "", c.WaitRunning(ctx, 3)
	}
}

// applyClient injects a client fault through its hook.
func applyClient(ctx context.Context, a Action, h Hooks) (Heal, error) {
	hook := h.CutClientLink
	if a.Kind == FreezeClient {
		hook = h.FreezeClient
	}
	if hook == nil {
		return nil, fmt.Errorf("nemesis: %s needs its hook (Hooks)", a.Kind)
	}
	undo, err := hook(ctx, a.Client)
	if err != nil {
		return nil, err
	}
	if undo == nil {
		return nil, errors.New("nemesis: a client hook returned no undo")
	}
	return func(context.Context) (string, error) { return "", undo() }, nil
}
