// Package ledger keeps the books of publishers with confirms that run
// through faults, and checks them against the messages found afterwards.
//
// Every message carries a unique ID (its MessageId and body): the
// publisher that owns it and a sequence number. A publisher reports what
// happened to each attempt: the publish call failed, it returned nil, its
// confirmation was an ack, a nack, or never came within the publisher's
// bound. Check then compares the books with the IDs found in the queue
// (and, in the soak, by consumers). The guarantee under test is
// at-least-once: every acked ID is found (duplicates are allowed),
// nothing is found that was never published, and every publish that
// returned nil was settled.
//
// The books take a byte or two per message, not a map entry, so that a
// soak's heap samples measure the client rather than the bookkeeping.
package ledger

import (
	"fmt"
	"sync"
)

// An ID names one message: the publisher that owns it and its number,
// from 1. Only its owner publishes it.
type ID struct {
	Pub int
	Seq int
}

// String is the ID's wire form, used as MessageId and body.
func (id ID) String() string { return fmt.Sprintf("p%02d-%08d", id.Pub, id.Seq) }

// Parse reads an ID's wire form.
func Parse(s string) (ID, error) {
	var id ID
	if _, err := fmt.Sscanf(s, "p%02d-%08d", &id.Pub, &id.Seq); err != nil || id.String() != s || id.Seq < 1 {
		return ID{}, fmt.Errorf("ledger: %q is not a message ID", s)
	}
	return id, nil
}

// Flags of one ID in the books.
const (
	published uint8 = 1 << iota // a publish call for it returned nil
	acked                       // a confirmation for it was an ack
	attempted                   // a publish call for it was made
)

// A Ledger records the fate of every publish attempt. It is safe for
// concurrent use by several publishers.
type Ledger struct {
	mu    sync.Mutex
	flags [][]uint8 // by publisher, then by Seq
	c     Counts
}

// Counts are the running totals of a Ledger. Each publish call that
// returned nil ends in exactly one of Acked, Nacked, NackedAtLoss or
// Outstanding once its publisher has settled it.
type Counts struct {
	IDs          int // distinct IDs published (publish returned nil at least once)
	AckedIDs     int // distinct IDs acked at least once
	Published    int // publish calls that returned nil, republishes included
	Republished  int // of Published, the ones for an ID published before
	Acked        int // confirmations that were acks
	Nacked       int // confirmations that were nacks on a live connection
	NackedAtLoss int // confirmations resolved "not acked" because the connection was lost
	Errored      int // publish calls that returned an error (nothing to confirm)
	Outstanding  int // confirmations that did not arrive within the publisher's bound
}

// New returns an empty Ledger.
func New() *Ledger { return &Ledger{} }

// at returns id's flags, growing the books as needed. l.mu is held.
func (l *Ledger) at(id ID) *uint8 {
	for len(l.flags) <= id.Pub {
		l.flags = append(l.flags, nil)
	}
	f := l.flags[id.Pub]
	for len(f) <= id.Seq {
		f = append(f, 0)
	}
	l.flags[id.Pub] = f
	return &f[id.Seq]
}

// Published records a publish call for id that returned nil: a
// confirmation is now owed for it.
func (l *Ledger) Published(id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.at(id)
	if *f&published != 0 {
		l.c.Republished++
	} else {
		l.c.IDs++
	}
	*f |= published | attempted
	l.c.Published++
}

// PublishFailed records a publish call for id that returned an error. The
// message may still have reached the broker, so finding it is no error.
func (l *Ledger) PublishFailed(id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.at(id) |= attempted
	l.c.Errored++
}

// Acked records a positive confirmation for id.
func (l *Ledger) Acked(id ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.at(id)
	if *f&acked == 0 {
		l.c.AckedIDs++
	}
	*f |= acked
	l.c.Acked++
}

// Nacked records a negative confirmation for id. atLoss says that the
// library resolved it "not acked" because the connection was lost, rather
// than the broker nacking it; either way the publisher must republish.
func (l *Ledger) Nacked(_ ID, atLoss bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if atLoss {
		l.c.NackedAtLoss++
	} else {
		l.c.Nacked++
	}
}

// Outstanding records a confirmation for id that did not arrive within the
// publisher's bound: a confirmation silently dropped, as far as the caller
// can tell.
func (l *Ledger) Outstanding(ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.c.Outstanding++
}

// Counts returns the running totals.
func (l *Ledger) Counts() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c
}

// Found counts the copies of each ID read back from the broker. It is
// safe for concurrent use by several consumers.
type Found struct {
	mu      sync.Mutex
	n       [][]uint8 // copies, by publisher then Seq, saturating at 255
	total   int
	foreign []string // MessageIds that are not IDs
}

// NewFound returns an empty Found.
func NewFound() *Found { return &Found{} }

// Add counts one copy of the message with this MessageId.
func (f *Found) Add(messageID string) {
	id, err := Parse(messageID)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.total++
	if err != nil {
		f.foreign = append(f.foreign, messageID)
		return
	}
	for len(f.n) <= id.Pub {
		f.n = append(f.n, nil)
	}
	s := f.n[id.Pub]
	for len(s) <= id.Seq {
		s = append(s, 0)
	}
	if s[id.Seq] < 255 {
		s[id.Seq]++
	}
	f.n[id.Pub] = s
}

// Total returns how many messages were counted, duplicates included.
func (f *Found) Total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}

func (f *Found) count(id ID) int {
	if id.Pub >= len(f.n) || id.Seq >= len(f.n[id.Pub]) {
		return 0
	}
	return int(f.n[id.Pub][id.Seq])
}

// A Report is the outcome of Check.
type Report struct {
	Counts
	Found      int      // messages found, duplicates included
	Duplicates int      // messages found beyond the first copy of their ID
	Lost       []ID     // acked IDs not found: must be empty
	Unknown    []string // messages found that were never published: must be empty
	Unacked    int      // IDs published but never acked (the publisher stopped before)
	UnackedIn  int      // of Unacked, how many were found anyway (the ack was lost, not the message)
}

// Check compares the books with the messages found.
func (l *Ledger) Check(found *Found) Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	found.mu.Lock()
	defer found.mu.Unlock()
	rep := Report{Counts: l.c, Found: found.total}
	rep.Unknown = append(rep.Unknown, found.foreign...)
	for pub, seqs := range found.n {
		for seq, n := range seqs {
			if n == 0 {
				continue
			}
			rep.Duplicates += int(n) - 1
			id := ID{pub, seq}
			if pub >= len(l.flags) || seq >= len(l.flags[pub]) || l.flags[pub][seq]&attempted == 0 {
				rep.Unknown = append(rep.Unknown, id.String())
			}
		}
	}
	for pub, seqs := range l.flags {
		for seq, f := range seqs {
			id := ID{pub, seq}
			switch {
			case f&acked != 0:
				if found.count(id) == 0 {
					rep.Lost = append(rep.Lost, id)
				}
			case f&published != 0:
				rep.Unacked++
				if found.count(id) > 0 {
					rep.UnackedIn++
				}
			}
		}
	}
	return rep
}

// String formats the report on one line, for a test log.
func (r Report) String() string {
	return fmt.Sprintf("ids=%d published=%d republished=%d acked=%d (ids %d) nacked=%d nacked-at-loss=%d "+
		"errored=%d outstanding=%d found=%d duplicates=%d unacked-ids=%d (found %d) lost=%d unknown=%d",
		r.IDs, r.Published, r.Republished, r.Acked, r.AckedIDs, r.Nacked, r.NackedAtLoss,
		r.Errored, r.Outstanding, r.Found, r.Duplicates, r.Unacked, r.UnackedIn, len(r.Lost), len(r.Unknown))
}

// Problems returns what in the report breaks the guarantee, one line each;
// none means the run kept it. An ID acked and not found, a message nobody
// published, and a confirmation that never came or was never waited for
// are each a failure.
func (r Report) Problems() []string {
	var p []string
	if n := len(r.Lost); n > 0 {
		p = append(p, fmt.Sprintf("%d acked messages were not found, e.g. %v", n, r.Lost[:min(n, 5)]))
	}
	if n := len(r.Unknown); n > 0 {
		p = append(p, fmt.Sprintf("%d messages found were never published, e.g. %q", n, r.Unknown[:min(n, 5)]))
	}
	if r.Outstanding > 0 {
		p = append(p, fmt.Sprintf("%d confirmations never arrived within the bound", r.Outstanding))
	}
	if settled := r.Acked + r.Nacked + r.NackedAtLoss + r.Outstanding; settled != r.Published {
		p = append(p, fmt.Sprintf("%d publishes returned nil but %d were settled: a confirmation was neither waited for nor counted", r.Published, settled))
	}
	return p
}
