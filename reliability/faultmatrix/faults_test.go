package faultmatrix

import (
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/internal/toxi"
)

// A fault is a Toxiproxy toxic, or the proxy going down, applied to every
// connection through the proxy.
type fault struct {
	name string
	// breaks says the connection cannot survive the fault: it must be
	// noticed and reported. The other faults only slow traffic down, and
	// every call must still succeed.
	breaks bool
	inject func(p *toxi.Proxy)
}

// faults are the seven faults of the matrix. Each acts on both directions
// where the direction matters for some phase: publishing loads the
// client-to-broker stream, consuming the other.
var faults = []fault{
	{name: "reset_peer", breaks: true, inject: func(p *toxi.Proxy) {
		// Both streams: whichever side speaks next (a heartbeat at the
		// least) gets the reset.
		p.ResetPeer(toxi.Downstream, 0)
		p.ResetPeer(toxi.Upstream, 0)
	}},
	{name: "timeout", breaks: true, inject: func(p *toxi.Proxy) {
		// A blackhole: the broker's frames stop, the socket stays open.
		// Only the heartbeat can tell.
		p.Timeout(toxi.Downstream, 0)
	}},
	{name: "latency", inject: func(p *toxi.Proxy) {
		p.Latency(toxi.Downstream, 200*time.Millisecond, 50*time.Millisecond)
		p.Latency(toxi.Upstream, 200*time.Millisecond, 50*time.Millisecond)
	}},
	{name: "bandwidth", inject: func(p *toxi.Proxy) {
		p.Bandwidth(toxi.Downstream, 16)
		p.Bandwidth(toxi.Upstream, 16)
	}},
	{name: "slicer", inject: func(p *toxi.Proxy) {
		// Frames arrive in pieces of 1 to 23 bytes, 50 µs apart.
		p.Slicer(toxi.Downstream, 12, 11, 50*time.Microsecond)
		p.Slicer(toxi.Upstream, 12, 11, 50*time.Microsecond)
	}},
	{name: "limit_data", breaks: true, inject: func(p *toxi.Proxy) {
		// A few heartbeats' worth, so that even an idle connection
		// reaches the limit within seconds.
		p.LimitData(toxi.Downstream, 24)
	}},
	{name: "down", breaks: true, inject: func(p *toxi.Proxy) { p.Disable() }},
}
