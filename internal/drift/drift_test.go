package drift

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/amqp091-drainer/amqp091-drainer/internal/upstreamtree"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const root = "../.."

// TestGuardsMatchThePinnedRelease is the drift guard itself: it fails, naming
// upstream's function and our counterpart, when the pinned release's text of
// a guarded function is not what upstream/guards.txt recorded, or when a
// counterpart is no longer declared where the guard says.
func TestGuardsMatchThePinnedRelease(t *testing.T) {
	version, guards, found, err := Pinned(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Error(f.Error())
	}
	if len(guards) < 30 {
		t.Errorf("upstream/guards.txt guards %d functions; the overlay carries versions of more (PATCHES.md)", len(guards))
	}
	t.Logf("%d guarded upstream functions as fingerprinted at %s", len(guards), version)
}

// TestChangedUpstreamFunctionFailsTheCheck changes one guarded function in a
// scratch copy of the pinned release, as a new release might, and expects
// the check to name it and our counterpart.
func TestChangedUpstreamFunctionFailsTheCheck(t *testing.T) {
	ctx := context.Background()
	pin, err := upstreamtree.ReadPin(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "tree")
	if err := upstreamtree.Pristine(ctx, pin, dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(GuardsFile(root))
	if err != nil {
		t.Fatal(err)
	}
	guards, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := OverlayFiles(root)
	if err != nil {
		t.Fatal(err)
	}

	// A comment and a blank line are not a change.
	channel := filepath.Join(dir, "channel.go")
	src, err := os.ReadFile(channel)
	if err != nil {
		t.Fatal(err)
	}
	const anchor = "func (ch *Channel) dispatch(msg message) {\n"
	if !strings.Contains(string(src), anchor) {
		t.Fatalf("channel.go at %s lacks %q", pin.Version, anchor)
	}
	commented := strings.Replace(string(src), anchor, anchor+"\t// a comment a release might add\n\n", 1)
	if err := os.WriteFile(channel, []byte(commented), 0o644); err != nil {
		t.Fatal(err)
	}
	funcs, err := Funcs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if found := Check(guards, pin.Version, funcs, overlay); len(found) != 0 {
		t.Fatalf("a comment counted as drift: %v", found)
	}

	// One statement is.
	changed := strings.Replace(string(src), anchor, anchor+"\tch.connection.closed.Load()\n", 1)
	if err := os.WriteFile(channel, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	if funcs, err = Funcs(dir); err != nil {
		t.Fatal(err)
	}
	found := Check(guards, pin.Version+" (changed)", funcs, overlay)
	if len(found) != 1 {
		t.Fatalf("got %d findings, want 1 for Channel.dispatch: %v", len(found), found)
	}
	msg := found[0].Error()
	for _, want := range []string{"upstream's Channel.dispatch changed", "drainer_dispatch.go:chanDispatcher.dispatchMessage", "scripts/drift --accept"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the message lacks %q:\n%s", want, msg)
		}
	}
	t.Logf("the drift check says: %s", msg)
}

func TestCheckNamesAMissingCounterpart(t *testing.T) {
	guards := []Guard{{Upstream: "confirms.One", Ours: []string{"drainer_dispatch.go:drainConn.confirm", "outbox.go:gone"}, Fingerprint: Fingerprint("x")}}
	overlay := map[string][]byte{
		"drainer_dispatch.go": []byte("package amqp091\n\nfunc (d *drainConn) confirm(ch *Channel) {}\n"),
		"outbox.go":           []byte("package amqp091\n\nfunc (o *outbox) gone() {}\n"),
	}
	found := Check(guards, "v0", map[string]string{"confirms.One": "x"}, overlay)
	if len(found) != 1 || found[0].Missing != "outbox.go:gone" {
		t.Fatalf("got %+v, want outbox.go:gone missing", found)
	}
	if !strings.Contains(found[0].Error(), "no longer declares") {
		t.Errorf("unclear message: %s", found[0].Error())
	}
}

func TestParseFormatRoundTrip(t *testing.T) {
	in := "# header\n# two\nChannel.dispatch  drainer_dispatch.go:chanDispatcher.dispatchMessage  sha256:ab\nwriteFrame  publish.go:appendFrameStart,publish.go:appendFrameEnd  sha256:cd\n"
	guards, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	out := Format(Header([]byte(in)), guards)
	again, err := Parse(out)
	if err != nil || len(again) != 2 || again[1].Ours[1] != "publish.go:appendFrameEnd" || !strings.HasPrefix(string(out), "# header\n# two\n") {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
	for _, bad := range []string{"Channel.dispatch x.go:y\n", "a b sha256:1\na c sha256:2\n", "a b md5:1\n"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}
