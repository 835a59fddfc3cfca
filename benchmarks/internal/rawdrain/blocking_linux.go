package rawdrain

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// blockingConn is a TCP socket read and written with blocking system
// calls on a descriptor of its own, which the runtime's network poller
// does not watch.
//
// The descriptor is a duplicate of the net.TCPConn's, made before that
// one is closed: closing it takes the connection's descriptor out of the
// poller's epoll set (the net package deletes it explicitly) while the
// socket stays open through the duplicate. Reading the net package's own
// descriptor in blocking mode instead would leave it in the epoll set,
// edge-triggered, and every segment that arrived would wake whichever
// thread waits in epoll_wait for the runtime's timers (the CPU profile's
// writer sleeps on one): the wake-ups this mode exists to avoid.
// (*net.TCPConn).File makes a duplicate too, but registers it with the
// poller.
type blockingConn struct {
	fd  int
	raw bool // syscall.RawSyscall rather than syscall.Syscall

	// mu orders interrupt, called from ctx's AfterFunc on any thread,
	// with Close: a shutdown(2) must never reach a descriptor number that
	// was closed and may have been reused.
	mu     sync.Mutex
	closed bool
}

// newBlockingConn takes c's socket out of the network poller and puts it
// in blocking mode. It closes c whatever happens.
func newBlockingConn(c net.Conn, raw bool) (*blockingConn, error) {
	defer c.Close()
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, fmt.Errorf("rawdrain: blocking reads need a *net.TCPConn, not %T", c)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(s uintptr) {
		// Close-on-exec, as every descriptor the runtime opens: the drain
		// runs in a process that may start others.
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			dupErr = os.NewSyscallError("fcntl", e)
			return
		}
		fd = int(r)
	}); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, dupErr
	}
	// O_NONBLOCK belongs to the open file description, which the
	// duplicate shares with c's descriptor; c is closed on return, so
	// nothing is left that expects it set.
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	return &blockingConn{fd: fd, raw: raw}, nil
}

// syscall3 makes a three-argument system call, telling the runtime about
// it (entersyscall, exitsyscall) unless b.raw. It retries EINTR: a signal
// (the CPU profile's SIGPROF, the runtime's preemption SIGURG) can end a
// blocking call early when a receive timeout is set, and SA_RESTART does
// not restart those.
func (b *blockingConn) syscall3(trap uintptr, p []byte) (int, error) {
	for {
		var r uintptr
		var e syscall.Errno
		if b.raw {
			r, _, e = syscall.RawSyscall(trap, uintptr(b.fd),
				uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		} else {
			r, _, e = syscall.Syscall(trap, uintptr(b.fd),
				uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		}
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

// Read reads with one blocking read(2). A receive timeout that expired
// (SetReadDeadline) is os.ErrDeadlineExceeded, as from a net.Conn.
func (b *blockingConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, err := b.syscall3(syscall.SYS_READ, p)
	switch {
	case errors.Is(err, syscall.EAGAIN):
		return 0, os.ErrDeadlineExceeded
	case err != nil:
		return 0, os.NewSyscallError("read", err)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p with blocking write(2): write(2) rather than
// send(2), so that /proc/self/io counts it as it counts go-floor's.
func (b *blockingConn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		n, err := b.syscall3(syscall.SYS_WRITE, p[written:])
		if err != nil {
			return written, os.NewSyscallError("write", err)
		}
		written += n
	}
	return written, nil
}

// SetReadDeadline bounds the reads that follow with a receive timeout
// (SO_RCVTIMEO), which a blocking read obeys; the zero time removes it.
// Unlike a net.Conn's deadline, the bound is relative: it applies to each
// read from its start.
func (b *blockingConn) SetReadDeadline(t time.Time) error {
	var tv syscall.Timeval
	if !t.IsZero() {
		// At least a microsecond: a zero timeval means no timeout.
		tv = syscall.NsecToTimeval(max(time.Until(t), time.Microsecond).Nanoseconds())
	}
	return os.NewSyscallError("setsockopt",
		syscall.SetsockoptTimeval(b.fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv))
}

// interrupt ends a blocking read or write in progress, and every later
// one, with shutdown(2): the read returns end of file. Closing the
// descriptor would not wake a thread blocked on it.
func (b *blockingConn) interrupt() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		_ = syscall.Shutdown(b.fd, syscall.SHUT_RDWR)
	}
}

// Close closes the socket.
func (b *blockingConn) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return os.NewSyscallError("close", syscall.Close(b.fd))
}
