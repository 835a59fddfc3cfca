package clusterfaults

import (
	"testing"
	"time"
)

// Folded repeats keep their last time, which lastBefore finds within its
// window: a storm's last nack, not its first.
func TestTimelineLastBefore(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var tl timeline
	tl.add(at(0), "fault")
	tl.add(at(100), "nack")
	tl.add(at(200), "nack") // folded into the entry at 100
	tl.add(at(300), "channel-reopen")
	tl.add(at(400), "nack")
	tl.add(at(500), "nack") // folded
	tl.add(at(900), "ack")
	if got := tl.since(at(0), at(1000)); got != "+0.00s fault, +0.10s nack ×2, +0.30s channel-reopen, +0.40s nack ×2, +0.90s ack" {
		t.Fatalf("since: %s", got)
	}
	for _, tc := range []struct {
		from, to, want int
		ok             bool
	}{
		{0, 900, 500, true},
		{0, 450, 400, true}, // the fold's first time, its last being past the window
		{0, 250, 200, true},
		{600, 900, 0, false},
	} {
		got, ok := tl.lastBefore("nack", at(tc.from), at(tc.to))
		if ok != tc.ok || (ok && !got.Equal(at(tc.want))) {
			t.Fatalf("lastBefore(nack, %d, %d) = %v, %v; want +%d ms, %v", tc.from, tc.to, got.Sub(t0), ok, tc.want, tc.ok)
		}
	}
}
