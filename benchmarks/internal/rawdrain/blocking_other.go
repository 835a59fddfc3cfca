//go:build !linux

package rawdrain

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// blockingConn stands in for Linux's: the blocking modes are an
// experiment on the machine the benchmarks run on, not a portable mode.
type blockingConn struct{}

// newBlockingConn closes c and says that the blocking modes need Linux.
func newBlockingConn(c net.Conn, raw bool) (*blockingConn, error) {
	c.Close()
	return nil, fmt.Errorf("rawdrain: blocking reads are implemented for Linux only: %w",
		errors.ErrUnsupported)
}

// The methods of link, never called: newBlockingConn returns no conn.
func (*blockingConn) Read([]byte) (int, error)        { return 0, errors.ErrUnsupported }
func (*blockingConn) Write([]byte) (int, error)       { return 0, errors.ErrUnsupported }
func (*blockingConn) SetReadDeadline(time.Time) error { return errors.ErrUnsupported }
func (*blockingConn) interrupt()                      {}
func (*blockingConn) Close() error                    { return nil }
