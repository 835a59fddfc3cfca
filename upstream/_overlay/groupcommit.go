// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"net"
	"sync"
)

// With CoalescePublishes (DrainerOptions, LegacyOptions), publishes arriving during a write
// join the next batch (a group commit, trading latency for system calls), which its first
// publisher writes (writev, groupMaxVecs a call) once the write before ends. A publish returns
// once written, with its write's error, as upstream's; a lone publisher never waits and
// allocates nothing. Other frames (acks, RPCs) go through c.sendM between batches.

const groupMaxVecs = 1000 // buffers a writev, under Linux's IOV_MAX (1024)

// writeGroup is a connection's group commit.
type writeGroup struct {
	mu      sync.Mutex
	writing bool        // a leader is writing, or about to
	next    *groupBatch // the frames waiting for the write in progress
}

// groupBatch is the frames of the publishers that arrived during one write.
type groupBatch struct {
	vecs, wrote net.Buffers   // wrote: vecs as a vectored write consumes it (writeVecs)
	n           int           // publishes in it
	turn, done  chan struct{} // closed: turn when it may be written, done once it is (err set)
	err         error
}

// writePublishGrouped writes n publishes' frames in a group commit, with its write's error; ch.m held.
func (c *Connection) writePublishGrouped(vecs net.Buffers, wv *net.Buffers, maxVecs, n int) error {
	g := &c.rp.base().group
	g.mu.Lock()
	if !g.writing { // nobody writes: write alone, as upstream
		g.writing = true
		g.mu.Unlock()
		c.sendM.Lock()
		err := c.writeVecs(vecs, wv, maxVecs)
		c.sendM.Unlock()
		g.handOn()
		return err
	}
	b := g.next
	first := b == nil
	if first {
		b = &groupBatch{turn: make(chan struct{}), done: make(chan struct{})}
		g.next = b
	}
	b.vecs = append(b.vecs, vecs...)
	b.n += n
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

// handOn ends a leader's turn: the next batch's first publisher, if any, writes next.
func (g *writeGroup) handOn() {
	g.mu.Lock()
	b := g.next
	g.next = nil
	g.writing = b != nil
	g.mu.Unlock()
	if b != nil {
		close(b.turn)
	}
}
