package nemesis

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
	"github.com/amqp091-drainer/amqp091-drainer/failover"
	"github.com/amqp091-drainer/amqp091-drainer/internal/cluster"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Workload configures one workload: Publishers failover.Publishers and
// Consumers failover.Consumers on its Queues, in one read mode, recording
// everything as events (see Event) so that Check can judge the run. It
// runs in a process of its own, so that the nemesis can freeze it.
//
// Publisher k (p1, p2, …) publishes to Queues[(k-1) % len(Queues)], and
// consumer k (c1, …) consumes the same queue, so that with as many of each
// as queues every queue has one of each.
type Workload struct {
	Mode   compat.Mode // the read mode of every connection
	Queues []string    // declared by the caller
	// URLs are the nodes, dialled round robin from a client's own
	// starting node. With ClusterDir set they are the harness's cluster
	// (cluster.Attach), dialled from inside its hub, each client from its
	// own address (ClientIPs) so that its link alone can be cut.
	URLs       []string
	ClusterDir string
	ClientIPs  map[string]string // client name ("p1", "c2") → hub address
	Publishers int               // default 1
	Consumers  int               // default 1
	Rate       int               // messages per second per publisher; default 100
	Heartbeat  time.Duration     // of every connection; default 1 s
	// Settle bounds, after ctx ends, the wait for the confirms of what
	// was published; default 10 s. What is unconfirmed then ends with
	// ctx's error.
	Settle time.Duration
	// HoldEvery: every HoldEvery-th delivery of a consumer is held for
	// HoldFor after it is recorded and before its ack, so that some are
	// held across a fault and their ack fails (a stale settlement, never a
	// loss: the broker delivers it again). 0 holds none.
	HoldEvery int
	HoldFor   time.Duration
}

func (w Workload) withDefaults() Workload {
	w.Publishers = max(w.Publishers, 1)
	w.Consumers = max(w.Consumers, 1)
	if w.Rate <= 0 {
		w.Rate = 100
	}
	if w.Heartbeat <= 0 {
		w.Heartbeat = time.Second
	}
	if w.Settle <= 0 {
		w.Settle = 10 * time.Second
	}
	return w
}

// Event is one line of a workload's record: a publish begun (pub), its
// Publish returned nil (ok) or an error (err, with Err), a delivery
// recorded (got), a client's connection (dial, with the node it landed
// on), what a client did about a fault (fo: a failover.Event, in Err),
// or, last, the process's end (end). T is Unix nanoseconds. Node and
// Gen say where a publish went: the node, and the channel generation
// ("3.2": the client's third connection, its second channel) current when
// the event was recorded.
type Event struct {
	Kind   string `json:"k"`
	ID     string `json:"id,omitempty"`
	T      int64  `json:"t"`
	Client string `json:"c,omitempty"`
	Node   string `json:"n,omitempty"`
	Gen    string `json:"g,omitempty"`
	Err    string `json:"err,omitempty"`
	End    *End   `json:"end,omitempty"`
}

// End is what a workload process says of itself once its clients closed.
type End struct {
	// Goroutines before the clients started and after they closed (the
	// recorder's own excepted): more after is a leak.
	GoroutinesBefore, GoroutinesAfter int
	// RSSKiB now, and the process's peak (VmHWM).
	RSSKiB, PeakRSSKiB int
	// AckErrors: the consumers' acks that failed because their
	// connection had gone, the held deliveries among them (stale
	// settlements).
	AckErrors uint64
	// Stats are each client's counters, as text.
	Stats []string
}

// recorder writes events as JSON lines, one at a time, flushed at once:
// the reader is the parent process, live.
type recorder struct {
	mu  sync.Mutex
	out *bufio.Writer
	err error
}

func (r *recorder) write(e Event) {
	if e.T == 0 {
		e.T = time.Now().UnixNano()
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

// client is one publisher's or consumer's dialling: round robin over the
// URLs from its own start, and its channel generation for the events.
type client struct {
	w     Workload
	name  string
	c     *cluster.Cluster // nil: plain dials
	rec   *recorder
	next  atomic.Int64 // index of the next URL to try first
	conns atomic.Int64
	chans atomic.Int64 // channels on the current connection
	node  atomic.Value // string
}

func (cl *client) dial(ctx context.Context) (*amqp.Connection, error) {
	first := int(cl.next.Load()) % len(cl.w.URLs)
	urls := append(append([]string{}, cl.w.URLs[first:]...), cl.w.URLs[:first]...)
	// A frozen node accepts TCP and never answers the AMQP handshake:
	// each attempt is bounded by a heartbeat, not DialCluster's default
	// 10 s, or a failover that tries a frozen node first waits that long
	// before the next (the nemesis's seed 1: a 12 s gap, 10 s of it
	// spent on a frozen node's handshake).
	opts := []compat.Option{compat.WithConfig(amqp.Config{Heartbeat: cl.w.Heartbeat}),
		compat.WithAttemptTimeout(cl.w.Heartbeat)}
	if cl.c != nil {
		opts = append(opts, compat.WithDialer(cl.c.DialFrom(cl.w.ClientIPs[cl.name])))
	}
	conn, err := compat.DialCluster(ctx, urls, cl.w.Mode, opts...)
	if err != nil {
		cl.next.Add(1) // the next try starts elsewhere
		return nil, err
	}
	node := "?"
	if i := urlIndex(cl.w.URLs, conn.RemoteAddr()); i >= 0 {
		cl.next.Store(int64(i + 1)) // a failover starts at the next node
		node = string(cluster.Nodes[i%len(cluster.Nodes)])
	}
	cl.node.Store(node)
	cl.conns.Add(1)
	cl.chans.Store(0)
	cl.rec.write(Event{Kind: "dial", Client: cl.name, Node: node, Gen: cl.gen()})
	return conn, nil
}

// onEvent counts the channels of the current connection, and records
// what the client did about a fault (a failover's events but the
// per-message ones), so that a history says why a gap lasted.
func (cl *client) onEvent(e failover.Event) {
	switch e.Kind {
	case failover.EventConnected:
		cl.chans.Add(1)
	case failover.EventNack, failover.EventRedelivered, failover.EventConsuming:
	default:
		what := e.Kind.String()
		if e.Err != nil {
			what += ": " + e.Err.Error()
		}
		cl.rec.write(cl.event("fo", "", errors.New(what)))
	}
}

// gen is the current channel generation, "conns.chans".
func (cl *client) gen() string {
	return strconv.FormatInt(cl.conns.Load(), 10) + "." + strconv.FormatInt(cl.chans.Load(), 10)
}

func (cl *client) event(kind, id string, err error) Event {
	e := Event{Kind: kind, ID: id, Client: cl.name, Gen: cl.gen()}
	e.Node, _ = cl.node.Load().(string)
	if err != nil {
		e.Err = err.Error()
	}
	return e
}

// urlIndex is the index of the URL whose host is addr, or -1.
func urlIndex(urls []string, addr net.Addr) int {
	for i, raw := range urls {
		if u, err := url.Parse(raw); err == nil && addr != nil && u.Host == addr.String() {
			return i
		}
	}
	return -1
}

// Run runs w until ctx ends, writing its events to out: each publisher
// publishes w.Rate messages a second, each with a unique MessageId and its
// own Publish call (failover.Publisher bounds them), and each consumer
// records, then acks. Once ctx ends the publishers stop, wait up to
// w.Settle for their confirms, and every client closes; the last event
// (end) says what the process holds then.
func (w Workload) Run(ctx context.Context, out io.Writer) error {
	w = w.withDefaults()
	if len(w.Queues) == 0 || len(w.URLs) == 0 {
		return errors.New("nemesis: a workload needs Queues and URLs")
	}
	before := runtime.NumGoroutine()
	rec := &recorder{out: bufio.NewWriter(out)}
	var c *cluster.Cluster
	if w.ClusterDir != "" {
		var err error
		if c, err = cluster.Attach(cluster.Options{Dir: w.ClusterDir}); err != nil {
			return err
		}
	}
	newClient := func(name string, k int) *client {
		cl := &client{w: w, name: name, c: c, rec: rec}
		cl.next.Store(int64(k))
		return cl
	}
	cctx, stopConsumers := context.WithCancel(context.Background())
	var consumers []*failover.Consumer
	var consuming sync.WaitGroup
	for k := range w.Consumers {
		cl := newClient(fmt.Sprintf("c%d", k+1), k)
		con, err := failover.NewConsumer(failover.ConsumerOptions{Dial: cl.dial, OnEvent: cl.onEvent,
			Queue: w.Queues[k%len(w.Queues)]})
		if err != nil {
			stopConsumers()
			return err
		}
		consumers = append(consumers, con)
		consuming.Go(func() { _ = con.Run(cctx, w.handler(cl)) })
	}
	pubs, err := w.publishAll(ctx, rec, newClient)
	stopConsumers()
	consuming.Wait()
	end := &End{GoroutinesBefore: before}
	for _, p := range pubs {
		end.Stats = append(end.Stats, fmt.Sprintf("%+v", p.Stats()))
	}
	for _, con := range consumers {
		st := con.Stats()
		end.AckErrors += st.AckErrors
		end.Stats = append(end.Stats, fmt.Sprintf("%+v", st))
	}
	end.GoroutinesAfter = settledGoroutines(before)
	end.RSSKiB, end.PeakRSSKiB = rss()
	rec.write(Event{Kind: "end", End: end})
	if err != nil {
		return err
	}
	return rec.err
}

// publishAll runs the publishers until ctx ends, settles and closes them.
func (w Workload) publishAll(ctx context.Context, rec *recorder, newClient func(string, int) *client) ([]*failover.Publisher, error) {
	var pubs []*failover.Publisher
	var wg sync.WaitGroup
	var errs []error
	for k := range w.Publishers {
		cl := newClient(fmt.Sprintf("p%d", k+1), k)
		p, err := failover.NewPublisher(ctx, failover.PublisherOptions{Dial: cl.dial, OnEvent: cl.onEvent,
			ConfirmTimeout: 2 * time.Second})
		if err != nil {
			errs = append(errs, err)
			break
		}
		pubs = append(pubs, p)
		wg.Go(func() { w.publish(ctx, p, cl, w.Queues[k%len(w.Queues)]) })
	}
	wg.Wait()
	for _, p := range pubs {
		errs = append(errs, p.Close())
	}
	return pubs, errors.Join(errs...)
}

// handler records a delivery, holds every HoldEvery-th, and lets the
// consumer ack it.
func (w Workload) handler(cl *client) func(context.Context, amqp.Delivery) error {
	n := 0
	return func(ctx context.Context, d amqp.Delivery) error {
		cl.rec.write(cl.event("got", d.MessageId, nil))
		if n++; w.HoldEvery > 0 && n%w.HoldEvery == 0 {
			t := time.NewTimer(w.HoldFor)
			defer t.Stop()
			select { // the hold is the scenario: the ack goes out after it
			case <-t.C:
			case <-ctx.Done():
			}
		}
		return nil
	}
}

// publish publishes to queue at w.Rate until ctx ends, then lets the
// last ones settle within w.Settle.
func (w Workload) publish(ctx context.Context, p *failover.Publisher, cl *client, queue string) {
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
		id := fmt.Sprintf("%s-%07d", cl.name, seq)
		cl.rec.write(cl.event("pub", id, nil))
		wg.Go(func() {
			err := p.Publish(settle, "", queue, false, amqp.Publishing{MessageId: id, Body: []byte(id),
				DeliveryMode: amqp.Persistent})
			kind := "ok"
			if err != nil {
				kind = "err"
			}
			cl.rec.write(cl.event(kind, id, err))
		})
	}
}

// settledGoroutines is the goroutine count once it falls to before, or
// after 5 s: closed clients' goroutines take a moment to return.
func settledGoroutines(before int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond) // polling a count no event announces
	}
}

// rss reads the process's resident set and its peak from /proc (0 where
// there is none).
func rss() (now, peak int) {
	b, _ := os.ReadFile("/proc/self/status")
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			now = v
		case "VmHWM:":
			peak = v
		}
	}
	return now, peak
}

// ReadHistory parses workloads' events into a History from start: each
// message's publishes, how its Publish ended, and its deliveries.
func ReadHistory(r io.Reader, start time.Time) (History, error) {
	byID := map[string]*Message{}
	var order []string
	h := History{Start: start}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return History{}, fmt.Errorf("nemesis: event %q: %w", sc.Text(), err)
		}
		if e.End != nil {
			h.Ends = append(h.Ends, *e.End)
			h.Stale += int(e.End.AckErrors)
		}
		if e.Kind == "dial" || e.Kind == "fo" {
			if h.Clients == nil {
				h.Clients = map[string][]Event{}
			}
			h.Clients[e.Client] = append(h.Clients[e.Client], e)
		}
		if e.ID == "" {
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
		m.Publisher = e.Client
		m.Publishes = append(m.Publishes, Publish{At: at, Node: cluster.Node(e.Node), Gen: e.Gen})
	case "ok":
		m.Confirmed, m.ConfirmedAt, m.ConfirmedGen = true, at, e.Node+known("/", e.Gen)
	case "err":
		m.Err = e.Err
	case "got":
		m.Deliveries = append(m.Deliveries, at)
	}
}
