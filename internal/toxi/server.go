package toxi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"

	"github.com/amqp091-drainer/amqp091-drainer/internal/testenv"
)

// readyTimeout bounds the wait for a Toxiproxy server's API to answer: a
// local one answers within milliseconds, a CI service container may still
// be starting.
const readyTimeout = 30 * time.Second

// server returns the API URL of this test binary's Toxiproxy server,
// starting the server on first use. A failure is remembered, so that every
// test reports the same cause instead of each trying again.
var server = sync.OnceValues(func() (string, error) {
	if u := os.Getenv("TOXIPROXY_URL"); u != "" {
		return connect(u, readyTimeout)
	}
	return startServer()
})

// connect uses the already running server at TOXIPROXY_URL.
func connect(u string, timeout time.Duration) (string, error) {
	if err := waitReady(u, nil, timeout); err != nil {
		return "", fmt.Errorf("toxi: no Toxiproxy server at TOXIPROXY_URL=%s: %v\n"+
			"Start it, or unset TOXIPROXY_URL to have the tests start their own", u, err)
	}
	return u, nil
}

// startServer starts a Toxiproxy server that lives as long as the test
// binary.
func startServer() (string, error) {
	// Arrange for the servers to be stopped before starting any: a server
	// without an owner would outlive the test binary.
	var procs []*process
	if err := testenv.AtExit(func() {
		for _, p := range procs {
			p.stop()
		}
	}); err != nil {
		return "", err
	}
	return launchRetrying(func(p *process) { procs = append(procs, p) })
}

// StartServer starts a Toxiproxy server for a program rather than a test,
// such as the benchmark runner, and returns its API URL and a function that
// stops it. The server is built as for tests, from the module that governs
// the working directory, and dies with the calling process.
func StartServer() (apiURL string, stop func(), err error) {
	var procs []*process
	stop = func() {
		for _, p := range procs {
			p.stop()
		}
	}
	u, err := launchRetrying(func(p *process) { procs = append(procs, p) })
	if err != nil {
		stop()
		return "", nil, err
	}
	return u, stop, nil
}

// launchRetrying builds the server if needed and starts it, handing every
// process it started to own, which must stop them.
func launchRetrying(own func(*process)) (string, error) {
	bin, err := serverBinary()
	if err != nil {
		return "", err
	}
	// The free port we pick may be taken before the server binds it, and
	// the server then exits; another port will do.
	var errs []error
	for range 3 {
		u, p, err := launch(bin)
		if p != nil {
			own(p)
		}
		if err == nil {
			return u, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("toxi: start %s: %w", bin, errors.Join(errs...))
}

// launch runs one server on a free port of 127.0.0.1 and waits until its
// API answers. It returns the process, for stopping, whenever one started.
func launch(bin string) (string, *process, error) {
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	// The server logs to a file rather than a pipe: copying a pipe would
	// take a goroutine of ours, and with it CPU time this process should
	// not be charged for. The file is unlinked once the server has it
	// open, so that nothing is left behind even if we are killed; our
	// descriptor still reads it, for error messages.
	log, err := os.CreateTemp("", "toxiproxy-server-*.log")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "-host", "127.0.0.1", "-port", port)
	cmd.Stdout, cmd.Stderr = log, log
	setDeathSignal(cmd)
	p, err := startProcess(cmd, log)
	_ = os.Remove(log.Name()) // fails harmlessly where open files cannot be removed
	if err != nil {
		log.Close()
		return "", nil, err
	}

	u := "http://" + net.JoinHostPort("127.0.0.1", port)
	if err := waitReady(u, p.exited, readyTimeout); err != nil {
		p.stop()
		return "", p, fmt.Errorf("port %s: %v; server log:\n%s", port, err, p.logTail)
	}
	return u, p, nil
}

// freePort returns a TCP port of 127.0.0.1 that is free right now.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

// waitReady polls the server's API until it answers, the deadline passes,
// or exited (if not nil) is closed because the server died.
func waitReady(u string, exited <-chan struct{}, timeout time.Duration) error {
	c := toxiproxy.NewClient(u)
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := c.Proxies()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("API not answering after %v: %w", timeout, err)
		}
		select {
		case <-exited:
			return errors.New("server exited")
		case <-tick.C:
		}
	}
}

// A process is a started server.
type process struct {
	cmd     *exec.Cmd
	log     *os.File      // its output, closed by stop
	exited  chan struct{} // closed once it has exited and been waited for
	logTail string        // end of its log, set by stop
	once    sync.Once
}

// startProcess starts cmd, whose output goes to log.
func startProcess(cmd *exec.Cmd, log *os.File) (*process, error) {
	p := &process{cmd: cmd, log: log, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// On Linux the child's death signal fires when the thread that
		// started it exits, not the process. The Go runtime may retire a
		// thread at any time, so the child would be killed at random.
		// Starting and waiting from one locked goroutine pins that thread
		// for exactly the child's life; it is discarded when the goroutine
		// returns, after the child is gone.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait() // killing it is how it ends; the status says nothing
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// stop kills the server, waits for it to exit, and closes its log after
// keeping the end of it for error messages. It is idempotent.
func (p *process) stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		p.logTail = tail(p.log, 2048)
		_ = p.log.Close()
		_ = os.Remove(p.log.Name()) // in case it could not be unlinked before
	})
}

// tail returns the last n bytes of f.
func tail(f *os.File, n int64) string {
	fi, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(fi.Size()-n, 0)
	b := make([]byte, fi.Size()-off)
	k, _ := f.ReadAt(b, off)
	return string(b[:k])
}
