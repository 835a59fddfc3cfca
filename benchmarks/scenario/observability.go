package scenario

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/benchmarks/internal/readmode"
)

// What the drainer's Logger says, in the order this scenario expects it:
// a listener's share of the budget, the pause, the resume.
const (
	msgDepthWarning = "amqp: a listener holds a large share of the read budget"
	msgPause        = "amqp: read budget full"
	msgResume       = "amqp: the drainer reads the socket again"
)

// Sizes of the observability scenario.
const (
	observedBudget   = 1 << 20                // DrainerOptions.Budget
	observedStall    = time.Second            // the listener stays unread after the pause
	observedInterval = 10 * time.Millisecond  // between two Stats samples
	observedTail     = 300 * time.Millisecond // sampled after the resume
	observedPauseBy  = 20 * time.Second       // the pause must come within this
	observedResumeBy = 10 * time.Second       // and the resume once the listener is read
)

// A stalled listener as the drainer's observability shows it: the Logger's
// depth warning, the pause of reading when the budget is full and the
// resume once the listener is read, against what Connection.Stats samples
// meanwhile. Only drainer mode keeps a budget, so it runs there alone.
func init() {
	Register(&Scenario{
		Name:  "observability",
		Title: "Observability: a stalled NotifyPublish listener in the Logger and in Stats",
		About: "Drainer mode only (the other modes keep no read budget: n/a). One connection, " +
			"DrainerOptions{Budget: 1 MiB, Logger} with a slog.Handler that keeps every record " +
			"and its time. A confirm-mode channel has an unbuffered NotifyPublish listener that " +
			"nobody reads; 1-byte messages are published with PublishWithContext until the " +
			"Logger reports the pause (\"amqp: read budget full\"), the listener stays unread " +
			"for 1 s more, then it is read until the Logger reports the resume. Stats() is " +
			"sampled every 10 ms throughout. Measured: the time from the depth warning (a " +
			"listener past 25 % of the budget) to the pause, how long reading paused, and the " +
			"peaks of budget used and of the listener's depth. One repetition under -quick.",
		Cases:     []string{"stalled-listener"},
		Modes:     []string{readmode.Drainer},
		QuickReps: 1,
		Timeout:   time.Minute,
		Run:       runObservability,
		Report: Report{
			Columns: []Column{
				{Label: "published", Metric: "published"},
				{Label: "warning → pause ms", Metric: "warn_to_pause_ms", Digits: 1},
				{Label: "pause ms", Metric: "pause_ms", Digits: 1},
				{Label: "peak budget used MiB", Metric: "peak_used_mib", Digits: 3},
				{Label: "peak depth", Metric: "peak_depth"},
			},
			Targets: []Target{
				MetricIs("drainer: the depth warning comes before the pause", "drainer", "warned_first", 1),
				MetricIs("drainer: reading resumes once the listener is read", "drainer", "resumed", 1),
			},
			Reference: "No reference figures: upstream and legacy hand notifications over inline " +
				"and keep no budget, so they have nothing to warn about or pause for.",
		},
	})
}

// A BudgetPoint is one Stats sample of the observability scenario.
type BudgetPoint struct {
	T      float64 `json:"t_s"`   // since the first publish
	Used   int64   `json:"used"`  // Budget.Used, bytes
	Depth  int     `json:"depth"` // Queued of the biggest NotifyPublish listener
	Paused bool    `json:"paused,omitempty"`
}

func runObservability(ctx context.Context, env *Env, _ string) (*Result, error) {
	if env.Mode != readmode.Drainer {
		return nil, fmt.Errorf("observability: n/a in %s mode: only drainer mode keeps a read budget", env.Mode)
	}
	q, err := env.Queue()
	if err != nil {
		return nil, err
	}
	logs := newRecordLog()
	conn, err := readmode.DialDrainer(env.URL, amqp.Config{}, observedBudget, slog.New(logs))
	if err != nil {
		return nil, err
	}
	defer closeWithin(conn, 2*time.Second)
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))

	start := time.Now()
	sampler := sampleBudget(conn, start)

	// Publish until the Logger reports the pause.
	pauseCtx, cancel := context.WithTimeout(ctx, observedPauseBy)
	defer cancel()
	published := 0
	msg := amqp.Publishing{Body: []byte{'x'}}
	for !logs.has(msgPause) {
		if err := ch.PublishWithContext(pauseCtx, "", q, false, false, msg); err != nil {
			sampler.stop()
			return nil, fmt.Errorf("publish %d, before any pause: %w", published+1, err)
		}
		published++
	}
	cancel()

	// Keep the listener unread a while, then read it until the resume.
	if err := sleepCtx(ctx, observedStall); err != nil {
		sampler.stop()
		return nil, err
	}
	readAt := time.Now()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case _, ok := <-confirms:
				if !ok {
					return
				}
			case <-done:
				return
			}
		}
	}()
	resumeCtx, cancelResume := context.WithTimeout(ctx, observedResumeBy)
	defer cancelResume()
	resumed := logs.wait(resumeCtx, msgResume)
	_ = sleepCtx(ctx, observedTail)
	points := sampler.stop()

	res := NewResult()
	res.Timeline = points
	res.Lines = map[string]string{}
	res.Set("published", float64(published))
	res.Set("resumed", boolMetric(resumed))
	res.Set("read_at_s", readAt.Sub(start).Seconds())
	var peakUsed int64
	peakDepth := 0
	for _, p := range points {
		peakUsed, peakDepth = max(peakUsed, p.Used), max(peakDepth, p.Depth)
	}
	res.Set("peak_used_mib", float64(peakUsed)/(1<<20))
	res.Set("peak_depth", float64(peakDepth))
	st, err := readmode.ReadBudget(conn)
	if err != nil {
		return nil, err
	}
	res.Set("pauses", float64(st.Pauses))
	res.Set("budget_mib", float64(st.Limit)/(1<<20))

	warn, warned := logs.first(msgDepthWarning)
	pause, _ := logs.first(msgPause)
	resume, _ := logs.first(msgResume)
	for name, r := range map[string]*slog.Record{"depth_warning": warn, "pause": pause, "resume": resume} {
		if r != nil {
			res.Lines[name] = textLine(*r)
			res.Set(name+"_at_s", r.Time.Sub(start).Seconds())
		}
	}
	res.Set("warned_first", boolMetric(warned && !warn.Time.After(pause.Time)))
	if warned {
		res.Set("warn_to_pause_ms", millis(pause.Time.Sub(warn.Time)))
	} else {
		res.Note("no depth warning before the pause")
	}
	if resumed {
		res.Set("pause_ms", millis(resume.Time.Sub(pause.Time)))
	} else {
		res.Note("reading did not resume within %v of reading the listener", observedResumeBy)
	}
	for _, r := range logs.all() {
		if m := r.Message; m != msgDepthWarning && !strings.HasPrefix(m, msgPause) && m != msgResume {
			res.Note("also logged: %s", textLine(r))
		}
	}
	return res, ctx.Err()
}

// textLine formats r as slog.NewTextHandler prints it.
func textLine(r slog.Record) string {
	var b bytes.Buffer
	_ = slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}).Handle(context.Background(), r)
	return strings.TrimSuffix(b.String(), "\n")
}

// A recordLog is a slog.Handler that keeps every record, with its time.
type recordLog struct {
	mu      sync.Mutex
	records []slog.Record
	changed chan struct{} // closed and replaced on every record
}

func newRecordLog() *recordLog { return &recordLog{changed: make(chan struct{})} }

func (l *recordLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *recordLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

// WithAttrs and WithGroup are not needed: the drainer logs every
// attribute with its record.
func (l *recordLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *recordLog) WithGroup(string) slog.Handler      { return l }

// first returns the first record whose message starts with prefix.
func (l *recordLog) first(prefix string) (*slog.Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.records {
		if strings.HasPrefix(l.records[i].Message, prefix) {
			r := l.records[i]
			return &r, true
		}
	}
	return nil, false
}

func (l *recordLog) has(prefix string) bool {
	_, ok := l.first(prefix)
	return ok
}

// wait waits for a record whose message starts with prefix, until ctx
// ends, and reports whether it came.
func (l *recordLog) wait(ctx context.Context, prefix string) bool {
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if l.has(prefix) {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return l.has(prefix)
		}
	}
}

func (l *recordLog) all() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.records...)
}

// A budgetSampler takes Stats every observedInterval until stopped.
type budgetSampler struct {
	quit   chan struct{}
	done   chan struct{}
	points []BudgetPoint
}

func sampleBudget(conn *amqp.Connection, start time.Time) *budgetSampler {
	s := &budgetSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(observedInterval)
		defer tick.Stop()
		for {
			if b, err := readmode.ReadBudget(conn); err == nil {
				s.points = append(s.points, BudgetPoint{T: time.Since(start).Seconds(),
					Used: b.Used, Depth: b.PublishDepth, Paused: b.Paused})
			}
			select {
			case <-tick.C:
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the samples.
func (s *budgetSampler) stop() []BudgetPoint {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
	return s.points
}
