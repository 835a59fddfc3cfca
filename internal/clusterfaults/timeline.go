package clusterfaults

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/amqp091-drainer/amqp091-drainer/failover"
)

// timeline records what a failover publisher did (its events, and the
// node each connection landed on), so that a cell's log says why a gap
// was as long as it was: which nodes were abandoned, after how long, and
// where confirms resumed.
type timeline struct {
	mu      sync.Mutex
	entries []tlEntry
}

type tlEntry struct {
	at   time.Time
	last time.Time // of the last repeat folded in
	what string
	n    int // repeats folded into this entry
}

// add records what happened at at; a repeat of the previous entry (a nack
// storm, say) is folded into it.
func (tl *timeline) add(at time.Time, what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if k := len(tl.entries); k > 0 && tl.entries[k-1].what == what {
		tl.entries[k-1].n++
		tl.entries[k-1].last = at
		return
	}
	tl.entries = append(tl.entries, tlEntry{at: at, last: at, what: what, n: 1})
}

// lastBefore returns the time of the last `what` from `from` to `to`.
func (tl *timeline) lastBefore(what string, from, to time.Time) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var last time.Time
	for _, e := range tl.entries {
		if e.what != what {
			continue
		}
		for _, at := range []time.Time{e.at, e.last} {
			if !at.Before(from) && !at.After(to) && at.After(last) {
				last = at
			}
		}
	}
	return last, !last.IsZero()
}

// sinceLast returns how long before `to` the last `what` from `from` on
// came, and whether one did. For a nack it is the client's share of a gap:
// the broker refuses until its election ends, so only what follows its
// last nack is the publisher's own.
func (tl *timeline) sinceLast(what string, from, to time.Time) (time.Duration, bool) {
	at, ok := tl.lastBefore(what, from, to)
	if !ok {
		return 0, false
	}
	return to.Sub(at), true
}

// event records a publisher event. Republish counts, failed dials and
// the end of an abandoned connection's close are left out: what caused
// them is in.
func (tl *timeline) event(e failover.Event) {
	switch e.Kind {
	case failover.EventRepublish, failover.EventAbandoned, failover.EventDialFailed:
		return
	}
	tl.add(e.Time, e.Kind.String())
}

// since lists the entries from `from` to `to`, each as seconds since
// from.
func (tl *timeline) since(from, to time.Time) string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var parts []string
	for _, e := range tl.entries {
		if e.at.Before(from) || e.at.After(to) {
			continue
		}
		s := fmt.Sprintf("+%.2fs %s", e.at.Sub(from).Seconds(), e.what)
		if e.n > 1 {
			s += fmt.Sprintf(" ×%d", e.n)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
