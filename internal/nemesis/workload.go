package nemesis

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/failover"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Workload configures one workload: a failover.Publisher and a
// failover.Consume on one queue, in one read mode, recording everything
// as events (see Event) so that Check can judge the run. It runs in a
// process of its own, so that the nemesis can freeze it.
type Workload struct {
	URL       string        // the broker; one node for now
	Mode      compat.Mode   // the read mode of both connections
	Queue     string        // declared by the caller
	Rate      int           // messages per second; default 100
	Heartbeat time.Duration // of both connections; default 1 s
	// Settle bounds, after ctx ends, the wait for the confirms of what
	// was published; default 10 s. What is unconfirmed then ends with
	// ctx's error.
	Settle time.Duration
}

// Event is one line of a workload's record: a publish begun (pub), its
// Publish returned nil (ok) or an error (err, with Err), a delivery
// handled (got), or, last, the clients' counters (stats, in Err). T is
// Unix nanoseconds.
type Event struct {
	Kind string `json:"k"`
	ID   string `json:"id,omitempty"`
	T    int64  `json:"t"`
	Err  string `json:"err,omitempty"`
}

// recorder writes events as JSON lines, one at a time, flushed at once:
// the reader is the parent process, live.
type recorder struct {
	mu  sync.Mutex
	out *bufio.Writer
	err error
}

func (r *recorder) add(kind, id string, err error) {
	e := Event{Kind: kind, ID: id, T: time.Now().UnixNano()}
	if err != nil {
		e.Err = err.Error()
	}
	b, _ := json.Marshal(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		_, r.err = r.out.Write(append(b, '\n'))
	}
	if r.err == nil {
		r.err = r.out.Flush()
	}
}

// Run runs w until ctx ends, writing its events to out: it publishes
// w.Rate messages a second, each with a unique MessageId and its own
// Publish call (failover.Publisher bounds them), and consumes the queue,
// acking after it records. Once ctx ends it stops publishing, waits up to
// w.Settle for the confirms, and closes both clients.
func (w Workload) Run(ctx context.Context, out io.Writer) error {
	if w.Rate <= 0 {
		w.Rate = 100
	}
	if w.Heartbeat <= 0 {
		w.Heartbeat = time.Second
	}
	if w.Settle <= 0 {
		w.Settle = 10 * time.Second
	}
	rec := &recorder{out: bufio.NewWriter(out)}
	dial := func(context.Context) (*amqp.Connection, error) {
		return compat.DialConfig(w.URL, amqp.Config{Heartbeat: w.Heartbeat}, w.Mode)
	}
	p, err := failover.NewPublisher(ctx, failover.PublisherOptions{Dial: dial, ConfirmTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	c, err := failover.NewConsumer(failover.ConsumerOptions{Dial: dial, Queue: w.Queue})
	if err != nil {
		return err
	}
	cctx, stopConsumer := context.WithCancel(context.Background())
	consumed := make(chan error, 1)
	go func() {
		consumed <- c.Run(cctx, func(_ context.Context, d amqp.Delivery) error {
			rec.add("got", d.MessageId, nil)
			return nil
		})
	}()
	w.publish(ctx, p, rec)
	stopConsumer()
	<-consumed
	err = p.Close()
	rec.add("stats", "", fmt.Errorf("publisher %+v; consumer %+v", p.Stats(), c.Stats()))
	if err != nil {
		return err
	}
	return rec.err
}

// publish publishes at w.Rate until ctx ends, then lets the last ones
// settle within w.Settle.
func (w Workload) publish(ctx context.Context, p *failover.Publisher, rec *recorder) {
	settle, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(w.Rate))
	defer tick.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			timer := time.AfterFunc(w.Settle, cancel)
			wg.Wait()
			timer.Stop()
			return
		case <-tick.C:
		}
		id := fmt.Sprintf("m-%07d", seq)
		rec.add("pub", id, nil)
		wg.Go(func() {
			err := p.Publish(settle, "", w.Queue, false, amqp.Publishing{MessageId: id, Body: []byte(id),
				DeliveryMode: amqp.Persistent})
			if err != nil {
				rec.add("err", id, err)
			} else {
				rec.add("ok", id, nil)
			}
		})
	}
}

// ReadHistory parses a workload's events into a History from start: each
// message's publishes, how its Publish ended, and its deliveries.
func ReadHistory(r io.Reader, start time.Time) (History, error) {
	byID := map[string]*Message{}
	var order []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return History{}, fmt.Errorf("nemesis: event %q: %w", sc.Text(), err)
		}
		if e.ID == "" { // the stats line
			continue
		}
		m := byID[e.ID]
		if m == nil {
			m = &Message{ID: e.ID}
			byID[e.ID] = m
			order = append(order, e.ID)
		}
		m.apply(e)
	}
	h := History{Start: start}
	for _, id := range order {
		h.Messages = append(h.Messages, *byID[id])
	}
	return h, sc.Err()
}

// apply records one event of m.
func (m *Message) apply(e Event) {
	at := time.Unix(0, e.T)
	switch e.Kind {
	case "pub":
		m.Publishes = append(m.Publishes, Publish{At: at})
	case "ok":
		m.Confirmed, m.ConfirmedAt = true, at
	case "err":
		m.Err = e.Err
	case "got":
		m.Deliveries++
	}
}
