// This file is part of amqp091-drainer's overlay on amqp091-go; it is not
// upstream code. See PATCHES.md at the root of the amqp091-drainer repository.

package amqp091

import (
	"bufio"
	"net"
	"sync"
)

// With CoalescePublishes (DrainerOptions, LegacyOptions), publishes of one
// connection that arrive while another publish is being written go out
// together, in the next write: a group commit. It is an option because it
// trades latency for system calls: a publisher that joins a batch parks
// until the batch is written, where one that found the write lock free
// would have written at once.
//
// Upstream writes and flushes each publish on its own, one system call per
// message however many goroutines publish at once. Here one publisher at a
// time writes (the leader); publishers arriving meanwhile add their frames
// to the next batch and wait. When the leader's write is done it hands the
// next batch to the publisher that started it, which writes the whole
// batch in one writev, and so on. Each publish still returns only once
// its frames are written, with the error of the write that carried them,
// as upstream's does; a publisher waits for at most the write in progress
// and its own batch's; a lone publisher never waits for anyone and
// allocates nothing. Frames of other writers (upstream's write path:
// acks, RPCs) still go through c.sendM, as before, between batches.

// groupMaxVecs bounds the buffers of one writev, under Linux's IOV_MAX
// (1024): a batch larger than this is written in several.
const groupMaxVecs = 1000

// writeGroup is a connection's group commit.
type writeGroup struct {
	mu      sync.Mutex
	writing bool        // a leader is writing, or about to
	next    *groupBatch // the frames waiting for the write in progress
}

// groupBatch is the frames of the publishers that arrived during one
// write. Its first publisher writes it when its turn comes.
type groupBatch struct {
	vecs  net.Buffers
	n     int           // publishes in it
	turn  chan struct{} // closed when the first publisher is to write it
	done  chan struct{} // closed once written, err set
	err   error
	wrote net.Buffers // vecs as written (writeVectors consumes them)
}

// writePublishGrouped writes pb's frames through the group commit, and
// returns once they are written, with the error of the write that
// carried them. The caller holds ch.m, not c.sendM.
func (c *Connection) writePublishGrouped(pb *publishBuf) error {
	g := &c.rp.base().group
	g.mu.Lock()
	if !g.writing {
		// Nobody writes: write alone, as upstream.
		g.writing = true
		g.mu.Unlock()
		c.sendM.Lock()
		err := c.writePublish(pb)
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
	b.vecs = append(b.vecs, pb.vecs...)
	b.n++
	g.mu.Unlock()

	if !first {
		c.rp.base().io.coalesced.Add(1)
		<-b.done
		return b.err
	}
	<-b.turn // the write before is done: ours, with everyone who joined
	c.sendM.Lock()
	b.err = c.writeBatch(b)
	c.sendM.Unlock()
	close(b.done)
	g.handOn()
	return b.err
}

// handOn ends a leader's turn: the batch that gathered during its write is
// written next, by its first publisher; with none, nobody writes.
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

// writeBatch writes a batch's frames after whatever upstream's write path
// left buffered, as writePublish writes one publish's. Under c.sendM.
func (c *Connection) writeBatch(b *groupBatch) error {
	buf, _ := c.writer.w.(*bufio.Writer)
	if buf != nil {
		if err := buf.Flush(); err != nil {
			return err
		}
	}
	if out := &c.rp.base().pub; buf != nil && out.buf == buf && out.out != nil {
		for len(b.vecs) > 0 {
			n := len(b.vecs)
			if n > groupMaxVecs {
				n = groupMaxVecs
			}
			b.wrote = b.vecs[:n:n]
			if _, err := out.out.writeVectors(&b.wrote); err != nil {
				return err
			}
			b.vecs = b.vecs[n:]
		}
		return nil
	}
	// Another writer (a generation being replaced): as upstream writes.
	return c.writeThrough(b.vecs, buf)
}
