package drainer

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// blockingConns counts the sockets read with blocking calls now (MaxBlockingConns).
var blockingConns atomic.Int64

// blockingSocket makes conn's socket a blockingConn if it is a *net.TCPConn and the cap
// leaves room, closing conn; else it returns conn, read through the poller.
//
// The blockingConn reads a duplicate of conn's descriptor, and conn is closed: closing it
// takes the socket out of the poller's epoll set (the net package deletes it there), while
// the socket stays open through the duplicate. Left in the set, edge-triggered, every
// segment that arrived would wake a thread waiting in epoll_wait for the runtime's timers:
// the wake-ups a blocking read exists to avoid. (*net.TCPConn).File duplicates too, but
// puts the new descriptor in the poller.
func blockingSocket(conn net.Conn, timeout time.Duration) (net.Conn, error) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return conn, nil
	}
	if blockingConns.Add(1) > MaxBlockingConns {
		blockingConns.Add(-1)
		return conn, nil
	}
	fd, err := dupSocket(tc)
	if err == nil {
		// O_NONBLOCK belongs to the open file description, which the duplicate shares with
		// tc's descriptor, closed now: nothing is left that expects it set.
		err = os.NewSyscallError("fcntl", syscall.SetNonblock(fd, false))
		if err != nil {
			_ = syscall.Close(fd)
		}
	}
	_ = tc.Close()
	if err != nil {
		blockingConns.Add(-1)
		return nil, err
	}
	b := &blockingConn{fd: fd, local: tc.LocalAddr(), remote: tc.RemoteAddr()}
	b.rdl.opt, b.wdl.opt = syscall.SO_RCVTIMEO, syscall.SO_SNDTIMEO
	// The handshake's bound, which the dialler set on tc's descriptor as a deadline that
	// the runtime kept, not the kernel; upstream clears it once the handshake is done.
	_ = b.SetDeadline(time.Now().Add(timeout))
	return b, nil
}

// dupSocket duplicates tc's descriptor, close-on-exec as every descriptor the runtime opens.
func dupSocket(tc *net.TCPConn) (int, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var errno syscall.Errno
	if err := rc.Control(func(s uintptr) {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
		fd, errno = int(r), e
	}); err != nil {
		return -1, err
	}
	if errno != 0 {
		return -1, os.NewSyscallError("fcntl", errno)
	}
	return fd, nil
}

// blockingConn is a TCP socket that the net package's poller does not watch, read and
// written with blocking system calls: the calling goroutine's thread sleeps in the kernel
// until bytes arrive, a timeout ends, or Close shuts the socket down.
//
// Reads hold rmu, and writes wmu, across their system calls: one read and one write at a
// time, as on a net.Conn, and each direction's kernel timeout is its lock holder's. Close
// takes both before it closes the descriptor, after a shutdown(2) that ends the calls in
// progress (closing a descriptor wakes nobody blocked on it): so no call is ever made on
// a descriptor number that was closed, which the kernel may have given to another file.
type blockingConn struct {
	fd            int
	local, remote net.Addr
	rmu, wmu      sync.Mutex
	rdl, wdl      timeout
	iov           []syscall.Iovec // WriteBuffers' vectors, under wmu
	closed        atomic.Bool
	closeOnce     sync.Once
	closeErr      error
}

// timeout is one direction's deadline, which a net.Conn keeps as an instant, and the
// kernel's timeout for it (SO_RCVTIMEO, SO_SNDTIMEO), which applies to each call from its
// start. Each call sets the timeout to what is left of the deadline, unless the one in
// force ends within deadlineSlack of it: so a deadline costs a setsockopt(2) every few
// milliseconds of a stream, not one per read.
type timeout struct {
	opt int           // the socket option
	at  atomic.Int64  // the deadline, in ns since epoch; 0: none
	set time.Duration // the timeout in force (0: none), under the direction's lock
}

const deadlineSlack = 2 * time.Millisecond

// epoch is the origin of timeout.at, so that a deadline is a monotonic instant.
var epoch = time.Now()

func (t *timeout) deadline(d time.Time) {
	var at int64
	if !d.IsZero() {
		at = max(int64(d.Sub(epoch)), 1) // 1: a deadline in the past, still a deadline
	}
	t.at.Store(at)
}

// arm sets the kernel's timeout for a call starting now; a deadline that passed is
// os.ErrDeadlineExceeded.
func (t *timeout) arm(fd int) error {
	var left time.Duration
	if at := t.at.Load(); at != 0 {
		left = time.Duration(at) - time.Since(epoch)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		left = max(left, time.Microsecond) // a zero timeval means no timeout
		if t.set > 0 && (t.set-left).Abs() <= deadlineSlack {
			return nil
		}
	} else if t.set == 0 {
		return nil
	}
	tv := syscall.NsecToTimeval(left.Nanoseconds())
	if err := syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, t.opt, &tv); err != nil {
		return os.NewSyscallError("setsockopt", err)
	}
	t.set = left
	return nil
}

// call makes one system call on the socket with t armed, until it succeeds or fails for
// good. EINTR and EAGAIN go round again: a signal ends a socket call that has a timeout
// even under SA_RESTART (the runtime's preemption sends SIGURG), and a timeout may end
// before the deadline, when the deadline moved after the call began.
func (c *blockingConn) call(op string, t *timeout, sys func(fd int) (int, syscall.Errno)) (int, error) {
	for {
		if c.closed.Load() {
			return 0, c.opError(op, net.ErrClosed)
		}
		if err := t.arm(c.fd); err != nil {
			return 0, c.opError(op, err)
		}
		n, errno := sys(c.fd)
		switch {
		case errno == 0:
			return n, nil
		case errno == syscall.EINTR || errno == syscall.EAGAIN:
			continue
		case c.closed.Load():
			return 0, c.opError(op, net.ErrClosed)
		}
		return 0, c.opError(op, os.NewSyscallError(op, errno))
	}
}

// opError says what failed as the net package does, so that errors.Is(err, net.ErrClosed)
// and os.ErrDeadlineExceeded hold, and crypto/tls sees a timeout as temporary.
func (c *blockingConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.local, Addr: c.remote, Err: err}
}

// Read reads with one blocking read(2).
func (c *blockingConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, err := c.call("read", &c.rdl, func(fd int) (int, syscall.Errno) {
		r, _, e := syscall.Syscall(syscall.SYS_READ, uintptr(fd),
			uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		return int(r), e
	})
	switch {
	case err != nil:
		return 0, err
	case n > 0:
		return n, nil
	case c.closed.Load(): // the shutdown(2) of Close reads as the end of the stream
		return 0, c.opError("read", net.ErrClosed)
	}
	return 0, io.EOF
}

// Write writes all of p with blocking write(2).
func (c *blockingConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	written := 0
	for written < len(p) {
		rest := p[written:]
		n, err := c.call("write", &c.wdl, func(fd int) (int, syscall.Errno) {
			r, _, e := syscall.Syscall(syscall.SYS_WRITE, uintptr(fd),
				uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
			return int(r), e
		})
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// maxIovecs is the most buffers one writev(2) takes (IOV_MAX).
const maxIovecs = 1024

// WriteBuffers writes all of v with blocking writev(2), consuming it as net.Buffers.WriteTo
// does; the amqp091 package's socket writer uses it for a publish's frames, which
// WriteTo would write one write(2) each, since only the net package's sockets have its
// vectored path.
func (c *blockingConn) WriteBuffers(v *net.Buffers) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	defer clear(c.iov) // keep no buffer alive
	var written int64
	for len(*v) > 0 {
		c.iov = c.iov[:0]
		for _, b := range *v {
			if len(b) > 0 && len(c.iov) < maxIovecs {
				c.iov = append(c.iov, syscall.Iovec{Base: &b[0], Len: uint64(len(b))})
			}
		}
		if len(c.iov) == 0 {
			*v = (*v)[len(*v):]
			break
		}
		n, err := c.call("writev", &c.wdl, func(fd int) (int, syscall.Errno) {
			r, _, e := syscall.Syscall(syscall.SYS_WRITEV, uintptr(fd),
				uintptr(unsafe.Pointer(&c.iov[0])), uintptr(len(c.iov)))
			return int(r), e
		})
		written += int64(n)
		consume(v, int64(n))
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// consume drops the first n bytes of v, as net.Buffers.WriteTo does with what it wrote.
func consume(v *net.Buffers, n int64) {
	for len(*v) > 0 {
		first := int64(len((*v)[0]))
		if first > n {
			(*v)[0] = (*v)[0][n:]
			return
		}
		n -= first
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}

// Close shuts the socket down, ending the calls in progress, then closes its descriptor.
func (c *blockingConn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		_ = syscall.Shutdown(c.fd, syscall.SHUT_RDWR)
		c.rmu.Lock()
		c.wmu.Lock()
		if err := syscall.Close(c.fd); err != nil {
			c.closeErr = c.opError("close", os.NewSyscallError("close", err))
		}
		c.wmu.Unlock()
		c.rmu.Unlock()
		blockingConns.Add(-1)
	})
	return c.closeErr
}

// ReadBlocksThread tells the drainer that a read blocks its thread in the kernel, so that
// its goroutine lets the goroutines it readied run before it reads (the amqp091 package's
// threadReader).
func (c *blockingConn) ReadBlocksThread() {}

// LocalAddr is the socket's local address.
func (c *blockingConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the broker's address.
func (c *blockingConn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both directions' deadlines.
func (c *blockingConn) SetDeadline(t time.Time) error {
	c.rdl.deadline(t)
	c.wdl.deadline(t)
	return nil
}

// SetReadDeadline sets the reads' deadline; a read blocked already keeps its own.
func (c *blockingConn) SetReadDeadline(t time.Time) error {
	c.rdl.deadline(t)
	return nil
}

// SetWriteDeadline sets the writes' deadline; a write blocked already keeps its own.
func (c *blockingConn) SetWriteDeadline(t time.Time) error {
	c.wdl.deadline(t)
	return nil
}
