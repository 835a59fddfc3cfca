package scenario

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Reference check "fragmented frames": one frame of frame_max bytes
// trickles in as ~512-byte slices at 16 KB/s. kombu's drainer once spun
// a full core here (busy ratio 0.97) because a read timeout in the middle
// of a frame sent it round its loop without waiting; fixed, it idles at
// 0.003–0.005 of a core. A Go reader that re-parses from scratch on every
// slice, or polls with short deadlines, would show up the same way.

const (
	// fragFrameMax is the broker's default frame_max, which the client
	// accepts: the largest frame the connection carries, 7 bytes of
	// header and the frame-end octet included.
	fragFrameMax = 131072
	// fragBodySize fills one body frame exactly: frame_max less the 8
	// bytes of framing. The message is then one 131,072-byte frame on the
	// wire, the reference's "131,072-byte frame", and the body arrives in
	// one piece rather than as a full frame and a remnant.
	fragBodySize = fragFrameMax - 8
	// fragRateKBps and fragSlice are the reference's throttle: Toxiproxy's
	// bandwidth rate counts kilobytes (1000 bytes) per second, and its
	// slicer cuts chunks of about average_size bytes.
	fragRateKBps = 16
	fragSlice    = 512
	// fragSliceVariation varies the slice size a little, as a real
	// network's segments vary, so that slice edges fall anywhere in the
	// frame rather than on a fixed stride.
	fragSliceVariation = 64
	// fragWait bounds the transfer, which takes about 8.2 s, with room
	// for a noisy machine.
	fragWait = 60 * time.Second
)

func init() {
	Register(&Scenario{
		Name:  "fragmented-frame",
		Title: "6. Fragmented frame: CPU while one frame trickles in",
		About: "A consumer in the mode under test (legacy: with a drain loop) reads through Toxiproxy, " +
			"whose broker-to-client direction is cut into slices of 512 ± 64 bytes (slicer, no delay) " +
			"and then limited to 16 KB/s (bandwidth). A direct connection publishes one 131,064-byte " +
			"message, which fills exactly one 131,072-byte body frame (frame_max). Measured: whether " +
			"the body arrives byte for byte, the transfer time, and the process's CPU busy ratio " +
			"(getrusage user + system CPU over wall time) from the publish to the delivery.",
		// The transfer is throttled, so the broker and CPU stay idle:
		// variants may share the machine without disturbing each other.
		Concurrent: true,
		Timeout:    90 * time.Second,
		Run:        runFragmented,
		Report: Report{
			Columns: []Column{
				{Label: "intact", Metric: "intact"},
				{Label: "transfer s", Metric: "transfer_s", Digits: 2},
				{Label: "CPU ms", Metric: "cpu_ms", Digits: 1},
				{Label: "busy (cores)", Metric: "busy_ratio", Digits: 4},
				{Label: "voluntary ctx switches", Metric: "ctx_switches"},
			},
			Ratios: []Ratio{
				{Label: "legacy busy / drainer busy", Metric: "busy_ratio", Num: "legacy", Den: "drainer"},
				{Label: "pristine busy / drainer busy", Metric: "busy_ratio", Num: "pristine", Den: "drainer"},
			},
			Targets: []Target{
				minEverywhere("the body arrives intact in every variant", "intact", 1),
				AtMost("drainer busy ratio at most 0.005 of a core", "drainer", "busy_ratio", 0.005, "cores"),
			},
			Reference: "py-amqp/kombu dedicated drainer: delivered intact in every run; busy ratio " +
				"0.003–0.005 of one core over the delivery (psutil), 0.97 before a fix to how the " +
				"drainer handles a read timeout mid-frame.",
		},
	})
}

func runFragmented(ctx context.Context, env *Env, _ string) (*Result, error) {
	queue, err := env.Queue()
	if err != nil {
		return nil, err
	}
	proxy, proxyURL, err := env.Proxy()
	if err != nil {
		return nil, err
	}
	conn, err := env.DialURL(proxyURL, amqp.Config{FrameSize: fragFrameMax})
	if err != nil {
		return nil, err
	}
	defer closeWithin(conn, 5*time.Second)
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	stopDrain := StartDrainLoop(conn, env.Mode, time.Second)
	defer stopDrain()

	// The toxics go on after the handshake, which they would slow down
	// for nothing. Toxiproxy chains a stream's toxics in the order they
	// were added: slicing first and throttling second delivers each
	// slice on its own, 32 ms after the previous one. The other order
	// would throttle first, in 1,600-byte bursts every 100 ms, and slice
	// each burst into back-to-back pieces that reach the reader together.
	if _, err := proxy.AddToxic("slicer", "slicer", "downstream", 1, toxiproxy.Attributes{
		"average_size": fragSlice, "size_variation": fragSliceVariation, "delay": 0, // delay is in µs
	}); err != nil {
		return nil, fmt.Errorf("add slicer: %w", err)
	}
	if _, err := proxy.AddToxic("bandwidth", "bandwidth", "downstream", 1, toxiproxy.Attributes{
		"rate": fragRateKBps,
	}); err != nil {
		return nil, fmt.Errorf("add bandwidth: %w", err)
	}

	// The publisher is a plain upstream connection straight to the broker,
	// in both builds: it is not under test, and its unthrottled frame
	// costs the same CPU (well under a millisecond) in every variant.
	pubConn, err := amqp.DialConfig(env.URL, amqp.Config{FrameSize: fragFrameMax})
	if err != nil {
		return nil, fmt.Errorf("dial publisher: %w", err)
	}
	defer closeWithin(pubConn, 5*time.Second)
	pub, err := pubConn.Channel()
	if err != nil {
		return nil, err
	}

	// A random body, so that a slice lost, repeated or misplaced anywhere
	// shows as a mismatch; a repeating pattern would hide shifts by its
	// period.
	body := make([]byte, fragBodySize)
	_, _ = rand.NewChaCha8([32]byte{4, 2}).Read(body)
	runtime.GC() // no collection of setup garbage inside the window

	before, err := sampleProc()
	if err != nil {
		return nil, err
	}
	if err := pub.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: body}); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	var got []byte
	select {
	case d, ok := <-deliveries:
		if !ok {
			return nil, fmt.Errorf("the consumer's channel closed before the delivery arrived")
		}
		got = d.Body
	case <-time.After(fragWait):
		return nil, fmt.Errorf("the fragmented delivery did not arrive within %v", fragWait)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	after, err := sampleProc()
	if err != nil {
		return nil, err
	}

	use := after.since(before)
	res := NewResult()
	res.Set("intact", boolMetric(bytes.Equal(got, body)))
	res.Set("body_bytes", float64(len(got)))
	res.Set("transfer_s", use.wall.Seconds())
	res.Set("cpu_ms", millis(use.cpu))
	res.Set("busy_ratio", use.busy())
	res.Set("ctx_switches", float64(use.nvcsw))
	if !bytes.Equal(got, body) {
		res.Note("the body arrived corrupted: %d bytes, want %d", len(got), len(body))
	}
	return res, nil
}
