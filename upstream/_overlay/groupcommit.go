// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"net"
	"sync"
)

// With CoalescePublishes (DrainerOptions, LegacyOptions), publishes and acks (basic.ack, nack,
// reject) arriving during a write join the next batch (a group commit, trading latency for system
// calls), which its first member writes (writev, groupMaxVecs a call) once the write before ends.
// Each returns once written, with its write's error; one finding nobody writing writes at once,
// alone, as upstream, allocating nothing more. RPCs go through c.sendM between batches. Order on a
// channel holds: publishes and acks join under ch.m (Ack, Nack, Reject hold it) until written, and
// any other frame is written before its call returns; so what was sent before an ack is out before
// it joins, and what is sent after it returned follows its batch, written whole under c.sendM.

const groupMaxVecs = 1000 // buffers a writev, under Linux's IOV_MAX (1024)

// writeGroup is a connection's group commit.
type writeGroup struct {
	mu      sync.Mutex
	writing bool        // a leader is writing, or about to
	next    *groupBatch // the frames waiting for the write in progress
}

// groupBatch is the frames of the publishes and acks that arrived during one write.
type groupBatch struct {
	vecs, wrote net.Buffers   // wrote: vecs as a vectored write consumes it (writeVecs)
	n           int           // publishes in it
	turn, done  chan struct{} // closed: turn when it may be written, done once it is (err set)
	err         error
}

// writeGrouped writes, ch.m held, n publishes' frames (vecs) or else the ack f in a group commit,
// with its write's error.
func (c *Connection) writeGrouped(vecs net.Buffers, wv *net.Buffers, maxVecs, n int, f *methodFrame) error {
	g := &c.rp.base().group
	g.mu.Lock()
	if !g.writing { // nobody writes: write alone, as upstream
		g.writing = true
		g.mu.Unlock()
		var err error
		c.sendM.Lock()
		if f != nil {
			err = c.writer.WriteFrame(f) // c.send's write
		} else {
			err = c.writeVecs(vecs, wv, maxVecs)
		}
		c.sendM.Unlock()
		g.handOn()
		return err
	}
	if f != nil { // upstream's bytes, for the batch
		var buf bytes.Buffer
		_ = f.write(&buf) // an ack's encoding cannot fail
		vecs = net.Buffers{buf.Bytes()}
	}
	first := g.next == nil
	if first {
		g.next = &groupBatch{turn: make(chan struct{}), done: make(chan struct{})}
	}
	b := g.next
	b.vecs, b.n = append(b.vecs, vecs...), b.n+n // each member's frames together, in arrival order
	g.mu.Unlock()
	if !first {
		c.rp.base().io.coalesced.Add(uint64(n))
		<-b.done
		return b.err
	}
	<-b.turn // the write before is done: ours, with everyone who joined
	c.sendM.Lock()
	b.err = c.writeVecs(b.vecs, &b.wrote, groupMaxVecs)
	c.sendM.Unlock()
	close(b.done)
	g.handOn()
	return b.err
}

// handOn ends a leader's turn: the next batch's first member, if any, writes next.
func (g *writeGroup) handOn() {
	g.mu.Lock()
	b := g.next
	g.next, g.writing = nil, b != nil
	g.mu.Unlock()
	if b != nil {
		close(b.turn)
	}
}

// sendGrouped is sendOpen (recoverytags.go's hook); with coalescing, an ack rides the group commit.
func (ch *Channel) sendGrouped(msg message) error {
	switch c := ch.connection; msg.(type) {
	case *basicAck, *basicNack, *basicReject:
		if c.rp != nil && c.rp.base().coalesce && !ch.IsClosed() && !c.IsClosed() {
			return c.publishWritten(c.writeGrouped(nil, nil, 0, 0, &methodFrame{ChannelId: ch.id, Method: msg}))
		}
	}
	return ch.sendOpen(msg) // as upstream; closed: ErrClosed
}
