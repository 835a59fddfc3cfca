package install

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// scratchMain is a user's program that only compiles against the patched
// build (amqp.Drainer, amqp.DrainerOptions and Connection.ReadMode are ours)
// and, run, needs the drainer to carry a publish and its confirm end to end.
const scratchMain = `package main

import (
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp.DialConfig(url, amqp.Config{ReadPath: amqp.Drainer(amqp.DrainerOptions{})})
	check("dial", err)
	fmt.Println("read mode:", conn.ReadMode())
	ch, err := conn.Channel()
	check("channel", err)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	check("declare", err)
	fmt.Println("queue declared:", q.Name != "")
	check("confirm", ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false,
		amqp.Publishing{ContentType: "text/plain", Body: []byte("hello from the drainer")})
	check("publish", err)
	acked, err := dc.WaitContext(ctx)
	check("confirm wait", err)
	fmt.Println("publish confirmed:", acked)
	check("close", conn.Close())
	fmt.Println("closed")
}

func check(what string, err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, what+":", err)
		os.Exit(1)
	}
}
`

// TestEndToEnd adopts the patched build in a fresh module the way a user
// would, and runs a drainer-mode program against the broker with it.
func TestEndToEnd(t *testing.T) {
	sc := newScratch(t)
	var out bytes.Buffer
	rep, err := Install(sc.ctx, Options{Module: sc.dir, Out: &out})
	t.Logf("Install:\n%s", out.String())
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	if !rep.Rebuilt || !rep.GoModWritten {
		t.Fatalf("Install did nothing: %+v", rep)
	}
	sc.runProgram()
}

// A scratch is a user's module that requires pristine upstream amqp091-go
// and holds scratchMain, which needs the patched build to compile.
type scratch struct {
	t   *testing.T
	ctx context.Context
	dir string
	env []string
}

// newScratch creates the module and checks that scratchMain does not build
// before the patched tree is adopted, or the run afterwards would prove
// nothing. It needs RabbitMQ, for runProgram.
func newScratch(t *testing.T) *scratch {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a scratch module and needs RabbitMQ")
	}
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
		c, err := net.DialTimeout("tcp", "127.0.0.1:5672", 5*time.Second)
		if err != nil {
			t.Fatalf("no RabbitMQ at 127.0.0.1:5672 (%v): start it (rabbitmq-server -detached) or set AMQP_URL", err)
		}
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	// GOWORK=off and -mod=mod: the scratch module stands alone, whatever
	// workspace or flags the test runs under.
	sc := &scratch{t: t, ctx: ctx, dir: t.TempDir(),
		env: append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "AMQP_URL="+url)}
	writeFile(t, filepath.Join(sc.dir, "main.go"), scratchMain)
	sc.mustGo("mod", "init", "scratch")
	sc.mustGo("get", amqpPath+"@v1.16.0")
	if out, err := sc.goCmd("build", "-o", os.DevNull, "."); err == nil || !strings.Contains(out, "Drainer") {
		t.Fatalf("the scratch program built against pristine upstream (err %v); it must need the patched build", err)
	}
	return sc
}

// goCmd runs the go command in the scratch module, with extra environment.
func (sc *scratch) goCmd(args ...string) (string, error) {
	return sc.goCmdEnv(nil, args...)
}

func (sc *scratch) goCmdEnv(extra []string, args ...string) (string, error) {
	sc.t.Helper()
	start := time.Now()
	cmd := exec.CommandContext(sc.ctx, "go", args...)
	cmd.Dir, cmd.Env = sc.dir, append(append([]string(nil), sc.env...), extra...)
	cmd.WaitDelay = 10 * time.Second // a stuck child must not outlive the test
	out, err := cmd.CombinedOutput()
	sc.t.Logf("go %s (%v, err %v):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), err, out)
	return string(out), err
}

func (sc *scratch) mustGo(args ...string) string {
	sc.t.Helper()
	out, err := sc.goCmd(args...)
	if err != nil {
		sc.t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// runProgram builds and runs scratchMain, which must now use the drainer.
func (sc *scratch) runProgram() {
	sc.t.Helper()
	sc.mustGo("mod", "tidy")
	run := sc.mustGo("run", ".")
	for _, want := range []string{"read mode: drainer", "queue declared: true", "publish confirmed: true", "closed"} {
		if !strings.Contains(run, want+"\n") {
			sc.t.Errorf("program output does not have %q", want)
		}
	}
}
