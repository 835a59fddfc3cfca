package clusterfaults

import (
	"strings"
	"testing"
	"time"
)

// reportConfig sets every figure a target is computed from, so that the
// expected cells below are plain numbers.
var reportConfig = Config{
	ConfirmTimeout: 2 * time.Second,
	Heartbeat:      2 * time.Second,
	NetTicktime:    4 * time.Second,
}

var (
	drainer  = Variant{Name: "drainer"}
	upstream = Variant{Name: "upstream", Baseline: true}
)

// The targets, by fault: the confirm timeout + 1 s for a cut of
// the publisher's node, the broker's own time + 1 s when it also leads the
// queue, 1.5 heartbeats + 1 s for a cut link, 1 s otherwise.
func TestResumeTarget(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		id   string
		want time.Duration
	}{
		{reportConfig, "5+7", 3 * time.Second},
		{reportConfig, "5pm", 3 * time.Second},
		{reportConfig, "5pmL", 6500 * time.Millisecond}, // 1.25 × 4 s + 0.5 s + 1 s
		{reportConfig, "6a", 4 * time.Second},
		{reportConfig, "8L", 6500 * time.Millisecond},
		{reportConfig, "8o", 6500 * time.Millisecond},
		{reportConfig, "8", 3 * time.Second},
		{reportConfig, "8c", time.Second},
		{reportConfig, "1", time.Second},
		{reportConfig, "6b", time.Second},
		{Config{}, "5+7", 3 * time.Second}, // the defaults: a 2 s confirm timeout
		{Config{}, "5pmL", 76500 * time.Millisecond},
		{Config{Heartbeat: 10 * time.Second}, "6a", 16 * time.Second},
	} {
		if got := tc.cfg.ResumeTarget(Fault{ID: tc.id}); got != tc.want {
			t.Errorf("ResumeTarget(%s) with %+v = %v, want %v", tc.id, tc.cfg, got, tc.want)
		}
	}
}

// cells splits a Markdown table row into its cells.
func cells(row string) []string {
	row = strings.TrimSuffix(strings.TrimPrefix(row, "| "), " |")
	return strings.Split(row, " | ")
}

// Table's columns, by header, for the rows checked below.
const (
	colResumed = 4
	colTarget  = 5
	colGap     = 6
	colConfirm = 7
	colCounter = 9
	colLost    = 12
	colClose   = 14
	colShares  = 15
)

// Each row judges drainer and legacy against the fault's target (at the
// target is met), measures upstream without a verdict, and marks what
// needs a reader's eye in bold.
func TestTableJudges(t *testing.T) {
	f1 := Fault{ID: "1"}
	f5pmL := Fault{ID: "5pmL"}
	f57 := Fault{ID: "5+7", CloseDuring: true}
	f8L, f8 := Fault{ID: "8L"}, Fault{ID: "8"}
	for _, tc := range []struct {
		name string
		r    Result
		col  int
		want string
	}{
		{"resumed in time",
			Result{Fault: f1, Variant: drainer, Resumed: true, Resume: 400 * time.Millisecond},
			colTarget, "1000 ms met"},
		{"resumed at the target", Result{Fault: f1, Variant: drainer, Resumed: true, Resume: time.Second},
			colTarget, "1000 ms met"},
		{"resumed late",
			Result{Fault: f1, Variant: drainer, Resumed: true, Resume: 1500 * time.Millisecond},
			colTarget, "1000 ms **missed**"},
		{"never resumed", Result{Fault: f1, Variant: drainer},
			colTarget, "1000 ms **missed**"},
		{"never resumed, said so", Result{Fault: f1, Variant: drainer},
			colResumed, "not within the window"},
		{"upstream is not judged",
			Result{Fault: f1, Variant: upstream, Resumed: true, Resume: 5 * time.Second},
			colTarget, "1000 ms"},
		{"5pmL: the client's share met", Result{Fault: f5pmL, Variant: drainer, Resumed: true,
			Resume: 6 * time.Second, NackedFirst: true, AfterNack: 600 * time.Millisecond},
			colTarget, "6500 ms met; 600 ms after the last nack, ≤ 1000 ms met"},
		{"5pmL: the client's share missed", Result{Fault: f5pmL, Variant: drainer, Resumed: true,
			Resume: 7 * time.Second, NackedFirst: true, AfterNack: 1200 * time.Millisecond},
			colTarget, "6500 ms **missed**; 1200 ms after the last nack, ≤ 1000 ms **missed**"},
		{"5pmL: no nack, no share", Result{Fault: f5pmL, Variant: drainer, Resumed: true,
			Resume: 6 * time.Second}, colTarget, "6500 ms met"},
		{"5pmL: upstream's share is not judged", Result{Fault: f5pmL, Variant: upstream, Resumed: true,
			Resume: 6 * time.Second, NackedFirst: true, AfterNack: 2 * time.Second}, colTarget, "6500 ms"},
		{"5pmL: the client's share after the broker's readiness", Result{Fault: f5pmL, Variant: drainer,
			Resumed: true, Resume: 6 * time.Second, BrokerReadyOK: true, BrokerReady: 5600 * time.Millisecond,
			NackedFirst: true, AfterNack: 2 * time.Second},
			colTarget, "6500 ms met; 400 ms after the broker's readiness, ≤ 1000 ms met"},
		{"8L: the gap within the broker's share + 1 s", Result{Fault: f8L, Variant: drainer, Resumed: true,
			Resume: 7 * time.Second, BrokerReadyOK: true, BrokerReady: 6500 * time.Millisecond,
			MaxGap: 7200 * time.Millisecond},
			colTarget, "6500 ms **missed**; 500 ms after the broker's readiness, ≤ 1000 ms met; gap ≤ 7500 ms met"},
		{"8: the gap past 3 s", Result{Fault: f8, Variant: drainer, Resumed: true,
			Resume: 2500 * time.Millisecond, MaxGap: 3100 * time.Millisecond},
			colTarget, "3000 ms met; gap ≤ 3000 ms **missed**"},
		{"the shares", Result{Fault: f1, Variant: upstream, Resumed: true, Resume: 900 * time.Millisecond,
			BrokerReadyOK: true, BrokerReady: 300 * time.Millisecond}, colShares, "300 ms / 600 ms"},
		{"a client ahead of the probe", Result{Fault: f1, Variant: drainer, Resumed: true,
			Resume: 250 * time.Millisecond, BrokerReadyOK: true, BrokerReady: 300 * time.Millisecond},
			colShares, "300 ms / −50 ms"},
		{"no probe confirmed, no shares", Result{Fault: f1, Variant: drainer, Resumed: true,
			Resume: 250 * time.Millisecond}, colShares, ""},
		{"a long gap in seconds", Result{Fault: f1, Variant: drainer, MaxGap: 12340 * time.Millisecond},
			colGap, "12.3 s"},
		{"confirmed of published", Result{Fault: f1, Variant: drainer, Confirmed: 980, Published: 1000},
			colConfirm, "980 of 1000"},
		{"failover's counters",
			Result{Fault: f1, Variant: drainer, Failovers: 1, Reopens: 2, Abandons: 3},
			colCounter, "1 / 2 / 3"},
		{"upstream recovers", Result{Fault: f1, Variant: upstream, Failovers: 1},
			colCounter, "recovery"},
		{"nothing lost", Result{Fault: f1, Variant: drainer}, colLost, "0"},
		{"lost in bold", Result{Fault: f1, Variant: upstream, Lost: 3}, colLost, "**3**"},
		{"no Close timed", Result{Fault: f1, Variant: drainer, Close: time.Second}, colClose, ""},
		{"Close timed", Result{Fault: f57, Variant: drainer, Close: 2100 * time.Millisecond},
			colClose, "2100 ms"},
		{"Close's error, shortened", Result{Fault: f57, Variant: upstream, Close: 40 * time.Second,
			CloseErr: strings.Repeat("x", 70)}, colClose, "40.0 s (" + strings.Repeat("x", 57) + "...)"},
	} {
		lines := strings.Split(strings.TrimSuffix(Table(reportConfig, []Result{tc.r}), "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines, want a header, its rule and one row:\n%s",
				tc.name, len(lines), strings.Join(lines, "\n"))
		}
		head := cells(lines[0])
		rule := strings.Count(lines[1], "|---")
		row := cells(lines[2])
		if len(head) != 16 || rule != 16 || len(row) != 16 {
			t.Fatalf("%s: %d, %d and %d columns, want 16:\n%s",
				tc.name, len(head), rule, len(row), strings.Join(lines, "\n"))
		}
		if row[tc.col] != tc.want {
			t.Errorf("%s: column %q = %q, want %q", tc.name, head[tc.col], row[tc.col], tc.want)
		}
	}
}

// A row names its fault, round, variant and leader, in the results'
// order.
func TestTableRows(t *testing.T) {
	got := Table(reportConfig, []Result{
		{Fault: Fault{ID: "2"}, Round: 1, Variant: upstream, Leader: "b"},
		{Fault: Fault{ID: "2"}, Round: 1, Variant: drainer, Leader: "b"},
		{Fault: Fault{ID: "4"}, Round: 2, Variant: drainer, Leader: "a"},
	})
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	want := [][]string{
		{"2", "1", "upstream", "b"},
		{"2", "1", "drainer", "b"},
		{"4", "2", "drainer", "a"},
	}
	if len(lines) != 2+len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), 2+len(want), got)
	}
	for i, w := range want {
		if c := cells(lines[2+i]); strings.Join(c[:4], " ") != strings.Join(w, " ") {
			t.Errorf("row %d starts %v, want %v", i, c[:4], w)
		}
	}
}

func TestMs(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0 ms"},
		{1499 * time.Microsecond, "1 ms"},
		{9999 * time.Millisecond, "9999 ms"},
		{10 * time.Second, "10.0 s"},
		{76500 * time.Millisecond, "76.5 s"},
	} {
		if got := ms(tc.d); got != tc.want {
			t.Errorf("ms(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestShort(t *testing.T) {
	sixty := strings.Repeat("y", 60)
	if got := short(sixty); got != sixty {
		t.Errorf("short of 60 characters changed it: %q", got)
	}
	if got := short(sixty + "z"); got != strings.Repeat("y", 57)+"..." {
		t.Errorf("short of 61 characters = %q", got)
	}
}

// The legend says what each fault does and where the clients and the
// leader start, one line a fault.
func TestLegend(t *testing.T) {
	got := Legend(Faults(time.Second)[:2])
	want := "- fault 1: kill -9 of the queue leader (no client on it) (leader a, publisher on b, " +
		"consumer on c)\n" +
		"- fault 2: kill -9 of the publisher's node, the leader (leader b, publisher on b, " +
		"consumer on c)\n"
	if got != want {
		t.Fatalf("Legend:\n%s\nwant:\n%s", got, want)
	}
}
