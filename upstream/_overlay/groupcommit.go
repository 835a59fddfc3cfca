// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import (
	"bytes"
	"net"
	"sync"
)

// The group commit (CoalescePublishes in DrainerOptions and LegacyOptions, off by default).
// Publishes and acks (basic.ack, nack, reject) that arrive while another write is in progress
// join the next batch, which goes out in one vectored write (writev, groupMaxVecs buffers a
// call) once that write ends: fewer system calls for more latency. A publish or ack that finds
// nobody writing writes at once, alone, as upstream does, and allocates nothing more. Each
// returns once its frames are written, with its write's error. Every other frame (RPCs,
// replies, heartbeats) still takes c.sendM, so it goes out between batches, never inside one.
//
// Order on a channel holds. Publishes and acks join under ch.m (Ack, Nack and Reject hold it,
// as do the publish paths) and keep it until their frames are written, and every other frame
// of a channel is written before its call returns. So whatever was sent on a channel before
// an ack is out before the ack joins, and whatever is sent after the ack returned follows its
// batch, which is written whole under c.sendM.

// groupMaxVecs is the most buffers one vectored write takes: under Linux's IOV_MAX (1024).
const groupMaxVecs = 1000

// writeGroup is a connection's group commit and carries its writer role.
//
// The writer role is the right to write group-commit frames to the socket, held by one
// goroutine at a time: one writing alone, or the first member of a batch writing the batch.
// writing says that somebody holds it; next is the batch forming behind the write in
// progress. Both are guarded by mu, and a member decides in one mu section whether it takes
// the free role or joins next, so no batch forms without a holder to pass it the role.
// When a write ends, its holder passes the role (passWriterRole): to next's first member by
// closing next.role, or, with no batch waiting, back to nobody. mu is never held across a
// wait or a write; the write itself holds c.sendM, taken after ch.m (lock order ch.m →
// writer role → c.sendM).
//
// What the role guarantees: one batch at a time, written in the order the batches formed and
// with each member's frames in the order the members arrived; no member returns before its
// frames are written (done closes after the write), so a publish's pooled buffer, which the
// batch still points into, is reused only once it is on the wire; and no member is left
// waiting for a batch that nobody writes. Without it, two goroutines could each write a batch
// and interleave frames out of arrival order, a batch could form behind a write that already
// ended and wait for ever, and a member returning early would hand its buffer back while the
// batch still held it.
type writeGroup struct {
	mu      sync.Mutex
	writing bool        // the writer role is held (a write is in progress, or about to be)
	next    *groupBatch // the frames waiting for the write in progress to end; nil: none
}

// groupBatch is the frames of the publishes and acks that arrived during one write. Its
// members' frames change only under writeGroup.mu, before the role reaches it.
type groupBatch struct {
	vecs  net.Buffers   // every member's frames, in arrival order
	wrote net.Buffers   // vecs as the vectored write consumes it (writeVecs); no allocation
	role  chan struct{} // closed when the writer role passes to the batch's first member
	done  chan struct{} // closed once the batch is written; err is set before
	err   error
}

// writeGroupedVecs writes n publishes' frames (vecs, split every maxVecs buffers through *wv,
// as writeVecs) in the group commit, with its write's error. The caller holds ch.m. Written
// alone, a publish costs what it costs without coalescing, plus one uncontended g.mu.
func (c *Connection) writeGroupedVecs(vecs net.Buffers, wv *net.Buffers, maxVecs, n int) error {
	g := &c.rp.base().group
	g.mu.Lock()
	if g.writing {
		return c.joinBatch(g, vecs, n)
	}
	g.writing = true
	g.mu.Unlock()
	c.sendM.Lock()
	err := c.writeVecs(vecs, wv, maxVecs)
	c.sendM.Unlock()
	g.passWriterRole()
	return err
}

// writeGroupedFrame writes an ack's method frame f in the group commit, with its write's
// error. The caller holds ch.m. Written alone it goes out as upstream's c.send writes it (one
// WriteFrame, one flush, no allocation); joining a batch it is first encoded by upstream's
// methodFrame.write, so the bytes are the same either way.
func (c *Connection) writeGroupedFrame(f *methodFrame) error {
	g := &c.rp.base().group
	g.mu.Lock()
	if g.writing {
		var buf bytes.Buffer
		_ = f.write(&buf) // an ack's encoding cannot fail: no strings, no tables
		return c.joinBatch(g, net.Buffers{buf.Bytes()}, 0)
	}
	g.writing = true
	g.mu.Unlock()
	c.sendM.Lock()
	err := c.writer.WriteFrame(f)
	c.sendM.Unlock()
	g.passWriterRole()
	return err
}

// joinBatch adds a member's frames (vecs, n publishes) to the next batch, making the batch if
// there is none, while the writer role is held elsewhere; the caller holds g.mu, which
// joinBatch releases. The batch's first member waits for the role and writes the batch; any
// other waits until it is written.
func (c *Connection) joinBatch(g *writeGroup, vecs net.Buffers, n int) error {
	first := g.next == nil
	if first {
		g.next = &groupBatch{role: make(chan struct{}), done: make(chan struct{})}
	}
	b := g.next
	b.vecs = append(b.vecs, vecs...)
	g.mu.Unlock()
	if first {
		return c.writeBatch(g, b)
	}
	c.rp.base().io.coalesced.Add(uint64(n)) // written by another member's write
	<-b.done
	return b.err
}

// writeBatch is the first member's part: it waits for the writer role, writes every member's
// frames under c.sendM, releases the members with the write's error and passes the role on.
func (c *Connection) writeBatch(g *writeGroup, b *groupBatch) error {
	<-b.role
	c.sendM.Lock()
	b.err = c.writeVecs(b.vecs, &b.wrote, groupMaxVecs)
	c.sendM.Unlock()
	close(b.done)
	g.passWriterRole()
	return b.err
}

// passWriterRole ends the holder's write: the role goes to the next batch's first member if a
// batch formed meanwhile (writing stays true), else it is free. The batch is taken out of
// g.next in the same mu section, so later arrivals start a new batch behind it.
func (g *writeGroup) passWriterRole() {
	g.mu.Lock()
	b := g.next
	g.next = nil
	g.writing = b != nil
	g.mu.Unlock()
	if b != nil {
		close(b.role)
	}
}

// sendGrouped is sendOpen behind recoverytags.go's sendRecoverySafe: with coalescing on and
// the channel and connection open, an ack rides the group commit; anything else, or a
// closed channel or connection (upstream's ErrClosed), takes upstream's sendOpen.
func (ch *Channel) sendGrouped(msg message) error {
	switch msg.(type) {
	case *basicAck, *basicNack, *basicReject:
		c := ch.connection
		if c.rp != nil && c.rp.base().coalesce && !ch.IsClosed() && !c.IsClosed() {
			f := &methodFrame{ChannelId: ch.id, Method: msg}
			return c.publishWritten(c.writeGroupedFrame(f))
		}
	}
	return ch.sendOpen(msg)
}
