package clusterfaults

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// bookOf builds a book from its records: IDs started and confirmed at the
// given offsets from t0, and how often each ID was found.
func bookOf(started, confirmed map[string]int, found map[string]int) *book {
	b := newBook()
	for id, ms := range started {
		b.started[id] = at(ms)
	}
	for id, ms := range confirmed {
		b.confirmed[id] = at(ms)
	}
	for id, n := range found {
		b.found[id] = n
	}
	return b
}

// settle books each way a publish call ends: a confirm (kept once per ID,
// every one in confirms), its bound (unsettled), or another error
// (failed, its text kept).
func TestBookSettle(t *testing.T) {
	b := newBook()
	b.start("m1", at(0))
	b.start("m1", at(50)) // a retry keeps the first attempt's time
	if !b.started["m1"].Equal(at(0)) {
		t.Fatalf("started = %v, want the first attempt", b.started["m1"].Sub(t0))
	}
	slow := time.Now().Add(-3 * time.Second)
	b.settle("m1", time.Now(), nil)
	first := b.confirmed["m1"]
	b.settle("m1", time.Now(), nil) // a republish confirmed again
	b.settle("m2", slow, context.DeadlineExceeded)
	b.settle("m3", time.Now(), fmt.Errorf("publish: %w", context.DeadlineExceeded))
	b.settle("m4", time.Now(), errors.New("channel closed"))
	b.settle("m5", time.Now(), errors.New("channel closed"))
	if !b.confirmed["m1"].Equal(first) || len(b.confirms) != 2 || b.confirmedCount() != 1 {
		t.Fatalf("confirmed %v, %d confirms, count %d; want the first kept, 2, 1",
			b.confirmed, len(b.confirms), b.confirmedCount())
	}
	if b.unsettled != 2 || b.failed != 2 || b.errs["channel closed"] != 2 {
		t.Fatalf("unsettled %d, failed %d, errs %v; want 2, 2, channel closed ×2",
			b.unsettled, b.failed, b.errs)
	}
	if b.longest < 3*time.Second {
		t.Fatalf("longest = %v, want the slow call's 3 s or more", b.longest)
	}
}

// At most 8 distinct error texts are kept, and once 8 are, the counts
// stop too (a kept text's repeats included); failed counts every failure.
func TestBookKeepsAFewErrorTexts(t *testing.T) {
	b := newBook()
	b.settle("m", time.Now(), errors.New("error 00"))
	for i := range 12 {
		b.settle("m", time.Now(), fmt.Errorf("error %02d", i))
	}
	b.settle("m", time.Now(), errors.New("error 00"))
	if len(b.errs) != 8 || b.errs["error 00"] != 2 || b.errs["error 08"] != 0 || b.failed != 14 {
		t.Fatalf("errs %v, failed %d; want 8 texts, error 00 ×2, no error 08, 14 failed",
			b.errs, b.failed)
	}
}

// The resume is the first confirm of a message first published after the
// fault: a message started before it, confirmed after, does not count.
func TestBookResumedAfter(t *testing.T) {
	for _, tc := range []struct {
		name               string
		started, confirmed map[string]int
		want               time.Duration
		ok                 bool
	}{
		{"nothing confirmed", map[string]int{"a": 10}, nil, 0, false},
		{"only older messages confirmed after the fault",
			map[string]int{"a": -10, "b": -5}, map[string]int{"a": 400, "b": 500}, 0, false},
		{"the first new one",
			map[string]int{"old": -10, "a": 100, "b": 200, "c": 300},
			map[string]int{"old": 50, "a": 900, "b": 700, "c": 800}, 700 * time.Millisecond, true},
		{"confirmed, never started (the books disagree)", nil, map[string]int{"a": 100}, 0, false},
	} {
		b := bookOf(tc.started, tc.confirmed, nil)
		got, ok := b.resumedAfter(t0)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: resumedAfter = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// The longest gap runs from the fault to the first confirm, between
// confirms, and from the last one to the repair; confirms outside the
// window, and their order of arrival, do not matter.
func TestBookMaxGap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		confirms []int
		want     time.Duration
	}{
		{"no confirm at all", nil, 5 * time.Second},
		{"only before the fault", []int{-900, -10}, 5 * time.Second},
		{"from the fault to the first", []int{-10, 3000, 3100, 4000}, 3 * time.Second},
		{"between two", []int{100, 200, 2700, 4800}, 2500 * time.Millisecond},
		{"from the last to the repair", []int{100, 900}, 4100 * time.Millisecond},
		{"out of order", []int{4800, 200, 100, 2700}, 2500 * time.Millisecond},
		{"after the repair left out", []int{1000, 9000}, 4 * time.Second},
	} {
		b := newBook()
		for _, ms := range tc.confirms {
			b.confirms = append(b.confirms, at(ms))
		}
		if got := b.maxGap(at(0), at(5000)); got != tc.want {
			t.Errorf("%s: maxGap = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The audit: a confirmed ID never found is lost, every delivery past an
// ID's first is a duplicate, an ID found but never published is a phantom
// (but for the Close probe, which the stalled connection published).
func TestBookAudit(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		started, confirmed   map[string]int
		found                map[string]int
		lost, dups, phantoms int
		lostIDs              []string
	}{
		{"all found once",
			map[string]int{"a": 1, "b": 2}, map[string]int{"a": 3, "b": 4},
			map[string]int{"a": 1, "b": 1}, 0, 0, 0, nil},
		{"unconfirmed and not found is no loss",
			map[string]int{"a": 1, "b": 2}, map[string]int{"a": 3},
			map[string]int{"a": 1}, 0, 0, 0, nil},
		{"confirmed and not found is lost",
			map[string]int{"a": 1, "b": 2, "c": 3}, map[string]int{"c": 4, "a": 5, "b": 6},
			map[string]int{"b": 1}, 2, 0, 0, []string{"a", "c"}},
		{"duplicates count the extra deliveries",
			map[string]int{"a": 1, "b": 2}, map[string]int{"a": 3},
			map[string]int{"a": 3, "b": 2}, 0, 3, 0, nil},
		{"phantoms, the Close probe not among them",
			map[string]int{"a": 1}, map[string]int{"a": 2},
			map[string]int{"a": 1, "ghost": 1, closeProbe: 1}, 0, 0, 1, nil},
	} {
		b := bookOf(tc.started, tc.confirmed, tc.found)
		lost, dups, phantoms, ids := b.audit()
		if lost != tc.lost || dups != tc.dups || phantoms != tc.phantoms ||
			!reflect.DeepEqual(ids, tc.lostIDs) {
			t.Errorf("%s: audit = %d lost %v, %d duplicates, %d phantoms; want %d %v, %d, %d",
				tc.name, lost, ids, dups, phantoms, tc.lost, tc.lostIDs, tc.dups, tc.phantoms)
		}
	}
}

// The readiness probes, published into the variants' queues, are
// neither duplicates nor phantoms, however many are found.
func TestBookIgnoresReadinessProbes(t *testing.T) {
	b := newBook()
	b.consumed(readinessProbe, false)
	b.consumed(readinessProbe, true)
	if lost, dups, phantoms, _ := b.audit(); lost+dups+phantoms != 0 || b.redeliv != 0 {
		t.Fatalf("audit of two probes: %d lost, %d duplicates, %d phantoms, %d redelivered; want none",
			lost, dups, phantoms, b.redeliv)
	}
}

// A Result names at most 10 lost IDs, in order; it counts them all.
func TestBookAuditNamesTenLostIDs(t *testing.T) {
	b := newBook()
	for i := range 25 {
		id := fmt.Sprintf("m-%02d", i)
		b.started[id] = at(i)
		b.confirmed[id] = at(i + 1)
	}
	lost, _, _, ids := b.audit()
	if lost != 25 || len(ids) != 10 {
		t.Fatalf("audit: %d lost, %d named; want 25, 10", lost, len(ids))
	}
	for i := 1; i < len(ids); i++ {
		if ids[i-1] >= ids[i] {
			t.Fatalf("lost IDs not in order: %v", ids)
		}
	}
}

// account copies the ledger into a Result: distinct IDs, the audit, and
// the publish calls' ends, their errors sorted as "N× text".
func TestBookAccount(t *testing.T) {
	b := bookOf(map[string]int{"a": 1, "b": 2, "c": 3}, map[string]int{"a": 4, "b": 5},
		map[string]int{"a": 2, "ghost": 1})
	b.redeliv = 1
	b.unsettled = 1
	b.failed = 3
	b.errs = map[string]int{"timeout": 1, "closed": 2}
	b.longest = 1500 * time.Millisecond
	var res Result
	b.account(&res)
	want := Result{
		Published: 3, Confirmed: 2, Lost: 1, LostIDs: []string{"b"}, Duplicates: 1, Phantoms: 1,
		Redelivered: 1, Unsettled: 1, Failed: 3, Longest: 1500 * time.Millisecond,
		Errors: []string{"1x timeout", "2x closed"},
	}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("account:\n got %+v\nwant %+v", res, want)
	}
}

// The consumer resumed at its first delivery after its first consume
// that followed the injection; consumes before the injection do not
// count, and a consume with no delivery after it is no resume.
func TestConsumerLogResumedAfter(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		consuming, delivered []int
		want                 time.Duration
		reconsumes           int
		ok                   bool
	}{
		{"never consumed again", []int{-5000}, []int{-100, 200, 300}, 0, 0, false},
		{"consumed again, nothing since", []int{-5000, 800}, []int{-100, 200}, 0, 1, false},
		{"consumed again and delivered",
			[]int{-5000, 800, 1200}, []int{-100, 200, 900, 1300}, 900 * time.Millisecond, 2, true},
		{"a delivery at the consume itself is not after it",
			[]int{800}, []int{800, 850}, 850 * time.Millisecond, 1, true},
	} {
		var l consumerLog
		for _, ms := range tc.consuming {
			l.consuming = append(l.consuming, at(ms))
		}
		for _, ms := range tc.delivered {
			l.delivery(at(ms))
		}
		d, n, ok := l.resumedAfter(t0)
		if d != tc.want || n != tc.reconsumes || ok != tc.ok {
			t.Errorf("%s: resumedAfter = %v, %d, %v; want %v, %d, %v",
				tc.name, d, n, ok, tc.want, tc.reconsumes, tc.ok)
		}
	}
}
