package scenario

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// Reference 3 and upstream-baseline E: what idle connections cost the
// client. RabbitMQ's broker burned 110% CPU on 5,000 idle connections
// until its schedulers stopped busy-waiting; the client-side lesson is
// that a reader which polls or wakes more often than the heartbeat needs
// pays for it on every connection. Upstream pays two goroutines per
// connection (reader and heartbeater) and wakes for each heartbeat; the
// drainer folds the heartbeat into its reader's read deadline.

const (
	// idleConns is upstream-baseline E's count: near the broker's socket
	// limit (832), so the per-connection figures are not swamped by the
	// process's own baseline, and the scenario must not run beside others
	// that hold many connections.
	idleConns = 800
	// idleHeartbeat is E's heartbeat: a heartbeat frame each way every
	// 5 s per connection.
	idleHeartbeat = 10 * time.Second
	// idleWindow is E's measuring window, six heartbeat intervals.
	idleWindow = 30 * time.Second
	// idleSettle lets the handshakes' last frames and goroutines (the
	// drainer's per-channel dispatchers, which retire a second after
	// their channel's last frame) die down before anything is measured.
	idleSettle = 2 * time.Second
	// idleWorkers bounds the probes and closes in flight at once.
	idleWorkers = 32
	// idleCloseBound bounds closing all connections at the end, after
	// the measurement: what is still open then is left to the process's
	// exit.
	idleCloseBound = 20 * time.Second
)

func init() {
	Register(&Scenario{
		Name:  "idle-connections",
		Title: "7. Idle connections: client CPU, memory and goroutines",
		About: "800 connections are opened one after another with a 10 s heartbeat, each with one " +
			"channel; after 2 s to settle, the process's CPU time (getrusage) is measured over 30 s " +
			"of idleness. RSS (VmRSS), heap in use, stack in use and goroutines are the differences " +
			"from before the first dial, after a GC, divided by the connections. Afterwards each " +
			"connection is probed by opening a channel, to count those the broker closed during the " +
			"window. Legacy connections get no calls at all, as an application that only publishes " +
			"now and then would leave them, so nothing sends their heartbeats.",
		// drainer-blocking's price is here: an OS thread per connection (issue #40).
		Modes:   []string{readmode.Upstream, readmode.Legacy, readmode.Drainer, DrainerBlocking},
		Reps:    1, // 30 s of idleness per variant is the scenario; repetitions would double the suite
		Timeout: 2 * time.Minute,
		Run:     runIdle,
		Report: Report{
			Columns: []Column{
				{Label: "conns", Metric: "conns"},
				{Label: "CPU ms / 30 s", Metric: "cpu_ms", Digits: 1},
				{Label: "% of a core", Metric: "cpu_pct", Digits: 3},
				{Label: "µs / conn / s", Metric: "cpu_us_per_conn_s", Digits: 2},
				{Label: "RSS KiB / conn", Metric: "rss_kib_per_conn", Digits: 1},
				{Label: "heap KiB / conn", Metric: "heap_kib_per_conn", Digits: 1},
				{Label: "stack KiB / conn", Metric: "stack_kib_per_conn", Digits: 1},
				{Label: "goroutines / conn", Metric: "goroutines_per_conn", Digits: 2},
				{Label: "threads / conn", Metric: "threads_per_conn", Digits: 2},
				{Label: "wake-ups / s", Metric: "ctx_switches_per_s", Digits: 0},
				{Label: "closed during idle", Metric: "dead_after_idle"},
			},
			Ratios: []Ratio{
				{Label: "drainer CPU / pristine CPU", Metric: "cpu_ms", Num: "drainer", Den: "pristine"},
				{Label: "legacy CPU / pristine CPU", Metric: "cpu_ms", Num: "legacy", Den: "pristine"},
				{Label: "drainer RSS / pristine RSS", Metric: "rss_kib_per_conn", Num: "drainer", Den: "pristine"},
				{Label: "drainer-blocking CPU / drainer CPU", Metric: "cpu_ms", Num: DrainerBlocking, Den: "drainer"},
				{Label: "drainer-blocking RSS / drainer RSS", Metric: "rss_kib_per_conn", Num: DrainerBlocking,
					Den: "drainer"},
			},
			Targets: []Target{
				atMostRatio("drainer CPU at most 0.5× pristine upstream's",
					Ratio{Metric: "cpu_ms", Num: "drainer", Den: "pristine"}, 0.5),
				AtMost("drainer: 1 goroutine per connection", "drainer", "goroutines_per_conn", 1, "goroutines"),
			},
			Reference: "Upstream amqp091-go v1.16.0 on this machine (upstream-baseline E), 800 idle " +
				"connections, heartbeat 10 s, 30 s: 782 ms of client CPU (2.6% of a core, 32.6 µs per " +
				"connection per second), 26.0 KiB RSS (15.9 heap + 6.4 stack) and 2 goroutines per " +
				"connection, about 2,000 voluntary context switches per second, none closed. The " +
				"RabbitMQ server's own lesson (+sbwt): 5,000 idle connections cost 110% CPU busy-waiting, 14% without.",
		},
	})
}

func runIdle(ctx context.Context, env *Env, _ string) (*Result, error) {
	n, window := idleConns, idleWindow
	if env.Quick {
		n, window = 20, 3*time.Second
	}
	before, err := sampleMem()
	if err != nil {
		return nil, err
	}
	opening := time.Now()
	conns, dialErr := openIdle(ctx, env, n)
	openTime := time.Since(opening)
	defer closeIdle(conns)
	if len(conns) == 0 {
		return nil, fmt.Errorf("no connection opened: %w", dialErr)
	}

	if err := sleepCtx(ctx, idleSettle); err != nil {
		return nil, err
	}
	loaded, err := sampleMem()
	if err != nil {
		return nil, err
	}
	p0, err := sampleProc()
	if err != nil {
		return nil, err
	}
	if err := sleepCtx(ctx, window); err != nil {
		return nil, err
	}
	p1, err := sampleProc()
	if err != nil {
		return nil, err
	}
	use := p1.since(p0)

	res := NewResult()
	if dialErr != nil {
		res.Note("only %d of %d connections opened: %v", len(conns), n, dialErr)
	}
	per := func(d int64) float64 { return float64(d) / float64(len(conns)) }
	res.Set("conns", float64(len(conns)))
	res.Set("open_s", openTime.Seconds())
	res.Set("window_s", use.wall.Seconds())
	res.Set("cpu_ms", millis(use.cpu))
	res.Set("cpu_pct", 100*use.busy())
	res.Set("cpu_us_per_conn_s", float64(use.cpu.Microseconds())/float64(len(conns))/use.wall.Seconds())
	res.Set("ctx_switches_per_s", float64(use.nvcsw)/use.wall.Seconds())
	res.Set("rss_kib_per_conn", per(loaded.rss-before.rss)/1024)
	res.Set("heap_kib_per_conn", per(loaded.heapInuse-before.heapInuse)/1024)
	res.Set("stack_kib_per_conn", per(loaded.stackInuse-before.stackInuse)/1024)
	res.Set("goroutines_per_conn", per(int64(loaded.goroutines-before.goroutines)))
	res.Set("threads_per_conn", per(loaded.threads-before.threads))

	// Closed during the window: as the client saw it, and as a round trip
	// to the broker finds it. They differ where nothing reads the socket
	// (legacy), so a broker's connection.close waits there unread.
	closedSeen := 0
	for _, c := range conns {
		if c.IsClosed() {
			closedSeen++
		}
	}
	res.Set("closed_seen", float64(closedSeen))
	res.Set("dead_after_idle", float64(len(conns)-probeIdle(conns)))
	return res, nil
}

// openIdle dials n connections one after another, each with one channel,
// as E does. It stops at the first failure, which near the broker's
// socket limit may be another program's connections leaving too little
// room, and returns what it opened with that error.
func openIdle(ctx context.Context, env *Env, n int) ([]*amqp.Connection, error) {
	conns := make([]*amqp.Connection, 0, n)
	for len(conns) < n {
		if err := ctx.Err(); err != nil {
			return conns, err
		}
		conn, err := env.Dial(amqp.Config{Heartbeat: idleHeartbeat})
		if err != nil {
			return conns, err
		}
		if _, err := conn.Channel(); err != nil {
			closeWithin(conn, time.Second)
			return conns, fmt.Errorf("channel on connection %d: %w", len(conns)+1, err)
		}
		conns = append(conns, conn)
	}
	return conns, nil
}

// probeIdle opens a channel on every connection and returns on how many
// that worked: a round trip, so it finds connections the broker closed
// even when the client has not noticed. A probe that takes more than 5 s
// counts as dead.
func probeIdle(conns []*amqp.Connection) int {
	var alive atomic.Int64
	forEachConn(conns, func(c *amqp.Connection) {
		// A probe still running at 5 s is not counted alive.
		within(5*time.Second, func() {
			if _, err := c.Channel(); err == nil {
				alive.Add(1)
			}
		})
	})
	return int(alive.Load())
}

// closeIdle closes every connection, idleWorkers at a time, and gives up
// on those still open after idleCloseBound: the measurement is over, and
// the process's exit closes their sockets.
func closeIdle(conns []*amqp.Connection) {
	deadline := time.Now().Add(idleCloseBound)
	forEachConn(conns, func(c *amqp.Connection) {
		if left := time.Until(deadline); left > 0 {
			closeWithin(c, min(left, 5*time.Second))
		}
	})
}

// forEachConn runs f on every connection, idleWorkers at a time, so that
// probing or closing 800 connections takes about as long as their slowest
// few rather than the sum of all.
func forEachConn(conns []*amqp.Connection, f func(*amqp.Connection)) {
	next := make(chan *amqp.Connection)
	var wg sync.WaitGroup
	for range min(idleWorkers, len(conns)) {
		wg.Go(func() {
			for c := range next {
				f(c)
			}
		})
	}
	for _, c := range conns {
		next <- c
	}
	close(next)
	wg.Wait()
}
