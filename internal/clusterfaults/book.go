package clusterfaults

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// A book keeps one variant's accounts during a cell: when each message ID
// was first published and first confirmed, and how often it was found by
// consumers (or left in the queue). IDs are the MessageId and body.
type book struct {
	mu        sync.Mutex
	started   map[string]time.Time // first publish attempt
	confirmed map[string]time.Time // first positive confirm
	confirms  []time.Time          // every positive confirm, in order of arrival
	found     map[string]int       // deliveries and gets, by ID
	redeliv   int                  // deliveries flagged Redelivered
	unsettled int                  // publishes that ended at their bound, not confirmed
	failed    int                  // publishes that ended with another error
	errs      map[string]int       // publish errors by text (a few kept)
	longest   time.Duration        // the longest single publish call
	nacks     int                  // nacks seen (baseline; failover counts its own)
}

func newBook() *book {
	return &book{
		started:   map[string]time.Time{},
		confirmed: map[string]time.Time{},
		found:     map[string]int{},
		errs:      map[string]int{},
	}
}

func (b *book) start(id string, at time.Time) {
	b.mu.Lock()
	if _, ok := b.started[id]; !ok {
		b.started[id] = at
	}
	b.mu.Unlock()
}

// settle books the end of one publish call that began at t0.
func (b *book) settle(id string, t0 time.Time, err error) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := now.Sub(t0); d > b.longest {
		b.longest = d
	}
	switch {
	case err == nil:
		if _, ok := b.confirmed[id]; !ok {
			b.confirmed[id] = now
		}
		b.confirms = append(b.confirms, now)
	case errors.Is(err, context.DeadlineExceeded):
		b.unsettled++
	default:
		b.failed++
		if len(b.errs) < 8 {
			b.errs[err.Error()]++
		}
	}
}

func (b *book) nack() {
	b.mu.Lock()
	b.nacks++
	b.mu.Unlock()
}

// consumed records a delivery of id; the readiness probes are not the
// variant's messages.
func (b *book) consumed(id string, redelivered bool) {
	if id == readinessProbe {
		return
	}
	b.mu.Lock()
	b.found[id]++
	if redelivered {
		b.redeliv++
	}
	b.mu.Unlock()
}

// confirmedCount is the number of distinct IDs confirmed so far.
func (b *book) confirmedCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.confirmed)
}

// resumedAfter returns how long after t the first message first published
// after t was confirmed, and whether one was.
func (b *book) resumedAfter(t time.Time) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first time.Time
	for id, at := range b.confirmed {
		if s, ok := b.started[id]; ok && s.After(t) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return first.Sub(t), true
}

// maxGap returns the longest time without a confirm between from and to.
func (b *book) maxGap(from, to time.Time) time.Duration {
	b.mu.Lock()
	ts := append([]time.Time(nil), b.confirms...)
	b.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	prev, gap := from, time.Duration(0)
	for _, t := range ts {
		if t.Before(from) {
			continue
		}
		if t.After(to) {
			break
		}
		if d := t.Sub(prev); d > gap {
			gap = d
		}
		prev = t
	}
	if d := to.Sub(prev); d > gap {
		gap = d
	}
	return gap
}

// audit compares the books: confirmed IDs never found are lost; IDs found
// more than once are duplicates; IDs found that were never published are
// phantoms.
func (b *book) audit() (lost, dups, phantoms int, lostIDs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id := range b.confirmed {
		if b.found[id] == 0 {
			lost++
			if len(lostIDs) < 10 {
				lostIDs = append(lostIDs, id)
			}
		}
	}
	for id, n := range b.found {
		if n > 1 {
			dups += n - 1
		}
		if _, ok := b.started[id]; !ok && id != closeProbe {
			phantoms++
		}
	}
	sort.Strings(lostIDs)
	return lost, dups, phantoms, lostIDs
}

// account fills res's ledger: distinct IDs published and confirmed, the
// audit's lost, duplicate and phantom counts, and how the publish calls
// ended. It reads the books once the cell's goroutines have ended.
func (b *book) account(res *Result) {
	res.Lost, res.Duplicates, res.Phantoms, res.LostIDs = b.audit()
	b.mu.Lock()
	defer b.mu.Unlock()
	res.Published = len(b.started)
	res.Confirmed = len(b.confirmed)
	res.Redelivered = b.redeliv
	res.Unsettled = b.unsettled
	res.Failed = b.failed
	res.Longest = b.longest
	for e, n := range b.errs {
		res.Errors = append(res.Errors, fmt.Sprintf("%dx %s", n, e))
	}
	sort.Strings(res.Errors)
}
