package ledger

import (
	"testing"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
	"github.com/amqp091-drainer/amqp091-drainer/reliability/internal/level"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestParse(t *testing.T) {
	_ = level.Require(t) // the books of the suites: they run with them
	for _, id := range []ID{{0, 1}, {3, 12345678}, {12, 99}} {
		got, err := Parse(id.String())
		if err != nil || got != id {
			t.Errorf("Parse(%q) = %v, %v; want %v", id.String(), got, err, id)
		}
	}
	for _, s := range []string{"", "m1", "p00-00000000", "p1-00000001", "p01-1", "p01-00000001x"} {
		if id, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", s, id)
		}
	}
}

// TestCheck feeds the books every outcome and checks each is reported.
func TestCheck(t *testing.T) {
	_ = level.Require(t)
	l := New()
	id := func(seq int) ID { return ID{Pub: 1, Seq: seq} }
	l.Published(id(1)) // acked, found twice: a duplicate
	l.Acked(id(1))
	l.Published(id(2)) // acked, not found: lost
	l.Acked(id(2))
	l.Published(id(3)) // lost with the connection, republished, acked
	l.Nacked(id(3), true)
	l.Published(id(3))
	l.Acked(id(3))
	l.PublishFailed(id(4)) // failed, yet found: allowed
	l.Published(id(5))     // never settled: the books do not balance
	f := NewFound()
	for _, s := range []string{id(1).String(), id(1).String(), id(3).String(), id(4).String(), id(9).String(), "stray"} {
		f.Add(s)
	}
	r := l.Check(f)
	if r.IDs != 4 || r.Published != 5 || r.Republished != 1 || r.Acked != 3 || r.AckedIDs != 3 ||
		r.NackedAtLoss != 1 || r.Errored != 1 || r.Found != 6 || r.Duplicates != 1 || r.Unacked != 1 {
		t.Errorf("report %v", r)
	}
	if len(r.Lost) != 1 || r.Lost[0] != id(2) {
		t.Errorf("lost %v, want [%v]", r.Lost, id(2))
	}
	if len(r.Unknown) != 2 {
		t.Errorf("unknown %q, want the stray and %v", r.Unknown, id(9))
	}
	if p := r.Problems(); len(p) != 3 {
		t.Errorf("problems %q, want lost, unknown and unsettled", p)
	}
}
