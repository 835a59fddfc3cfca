// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Unit tests of blockGate (blockgate.go), which holds publishes while the
// broker blocks the connection: no broker, no socket, on synctest's fake
// clock. The gate's hooks in PublishWithContext need a Connection with a
// read path and are left to the broker tests; these drive the gate itself.

// TestUnitBlockGateOpen pins that an unblocked gate never holds a publish,
// whatever its ctx, even one already ended: the ctx check is upstream's, on
// entry, and the gate adds nothing while the broker reads.
func TestUnitBlockGateOpen(t *testing.T) {
	var g blockGate
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, ctx := range []context.Context{context.Background(), ended} {
		if err := g.wait(ctx); err != nil {
			t.Fatalf("an open gate returned %v", err)
		}
	}
	g.unblock() // unblocked twice: a no-op
	if err := g.wait(ended); err != nil {
		t.Fatalf("after a stray unblock: %v", err)
	}
}

// TestUnitBlockGateHoldsUntilUnblock pins the gate on the fake clock: while
// blocked, publishes whose ctx can end wait, and one unblock at 3 s
// releases them all at 3 s with no error; a publish whose ctx cannot end
// (context.Background) is not held, as upstream's publishes are not. A
// second block while blocked is the same block: one unblock ends it.
func TestUnitBlockGateHoldsUntilUnblock(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var g blockGate
		g.block()
		g.block()
		if err := g.wait(context.Background()); err != nil {
			t.Fatalf("a publish without a deadline was held: %v", err)
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var (
			mu       sync.Mutex
			released []time.Duration
			wg       sync.WaitGroup
		)
		for i := 0; i < 5; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := g.wait(ctx); err != nil {
					t.Errorf("a held publish returned %v at unblock", err)
				}
				mu.Lock()
				released = append(released, time.Since(start))
				mu.Unlock()
			}()
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		mu.Lock()
		if len(released) != 0 {
			t.Errorf("%d publishes went ahead while blocked", len(released))
		}
		mu.Unlock()
		g.unblock()
		wg.Wait()
		for _, at := range released {
			if at != 3*time.Second {
				t.Errorf("a publish was released at %s, want 3s (the unblock)", at)
			}
		}
		if err := g.wait(ctx); err != nil {
			t.Fatalf("after the unblock: %v", err)
		}
	})
}

// TestUnitBlockGateCtxEnds pins what a held publish returns when its ctx
// ends first: at exactly the deadline (or the cancel), an error that wraps
// the ctx's (errors.Is DeadlineExceeded / Canceled) and names
// connection.blocked, so the caller can tell why nothing was written. The
// gate stays shut for the others.
func TestUnitBlockGateCtxEnds(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var g blockGate
		g.block()
		start := time.Now()

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := g.wait(ctx)
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("the held publish returned at %s, want its 2s deadline", d)
		}
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection.blocked") {
			t.Errorf("err = %v, want DeadlineExceeded naming connection.blocked", err)
		}

		ctx2, cancel2 := context.WithCancel(context.Background())
		go func() {
			time.Sleep(time.Second)
			cancel2()
		}()
		if err := g.wait(ctx2); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want Canceled", err)
		}
		if d := time.Since(start); d != 3*time.Second {
			t.Errorf("the cancelled publish returned at %s, want 3s", d)
		}

		ctx3, cancel3 := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel3()
		if err := g.wait(ctx3); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the gate opened by itself: %v", err)
		}
	})
}

// TestUnitBlockGateReblock pins that each block is a gate of its own: a
// block after an unblock holds the publishes that come after it (the
// closed chan of the previous block does not let them through), and is
// ended by its own unblock.
func TestUnitBlockGateReblock(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var g blockGate
		g.block()
		g.unblock()
		g.block()
		start := time.Now()
		go func() {
			time.Sleep(4 * time.Second)
			g.unblock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := g.wait(ctx); err != nil {
			t.Fatalf("wait = %v", err)
		}
		if d := time.Since(start); d != 4*time.Second {
			t.Fatalf("the second block released its publish at %s, want 4s", d)
		}
	})
}

// TestUnitBlockGateConcurrent runs blocks, unblocks and waits side by side
// under the race detector: every wait returns, by its deadline at the
// latest, either nil or its ctx's error, and the last unblock leaves the
// gate open.
func TestUnitBlockGateConcurrent(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		var g blockGate
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			i := i
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 50; j++ {
					if (i+j)%2 == 0 {
						g.block()
					} else {
						g.unblock()
					}
					time.Sleep(time.Duration(i+1) * time.Millisecond)
				}
			}()
		}
		for i := 0; i < 8; i++ {
			i := i
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 50; j++ {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i+j%3)*time.Millisecond)
					if err := g.wait(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("wait = %v", err)
					}
					cancel()
				}
			}()
		}
		wg.Wait()
		g.unblock()
		if g.blocked.Load() != nil {
			t.Fatal("the gate is still shut after the last unblock")
		}
	})
}
