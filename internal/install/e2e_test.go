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
	defer cancel()

	dir := t.TempDir()
	// GOWORK=off and -mod=mod: the scratch module stands alone, whatever
	// workspace or flags the test runs under.
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "AMQP_URL="+url)
	goCmd := func(args ...string) (string, error) {
		t.Helper()
		start := time.Now()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, env
		cmd.WaitDelay = 10 * time.Second // a stuck child must not outlive the test
		out, err := cmd.CombinedOutput()
		t.Logf("go %s (%v, err %v):\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), err, out)
		return string(out), err
	}
	mustGo := func(args ...string) string {
		t.Helper()
		out, err := goCmd(args...)
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return out
	}

	writeFile(t, filepath.Join(dir, "main.go"), scratchMain)
	mustGo("mod", "init", "scratch")
	mustGo("get", amqpPath+"@v1.16.0")

	// Upstream v1.16.0 alone does not have the drainer: the program must
	// not compile before install, or the run below would prove nothing.
	if out, err := goCmd("build", "-o", os.DevNull, "."); err == nil || !strings.Contains(out, "Drainer") {
		t.Fatalf("the scratch program built against pristine upstream (err %v); it must need the patched build", err)
	}

	var out bytes.Buffer
	rep, err := Install(ctx, Options{Module: dir, Out: &out})
	t.Logf("Install:\n%s", out.String())
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	if !rep.Rebuilt || !rep.GoModWritten {
		t.Fatalf("Install did nothing: %+v", rep)
	}

	mustGo("mod", "tidy")
	run := mustGo("run", ".")
	for _, want := range []string{"read mode: drainer", "queue declared: true", "publish confirmed: true", "closed"} {
		if !strings.Contains(run, want+"\n") {
			t.Errorf("program output does not have %q", want)
		}
	}
}
