//go:build !linux

package drainer

import (
	"net"
	"time"
)

// blockingSocket returns conn as it is: blocking reads are Linux's only.
func blockingSocket(conn net.Conn, _ time.Duration) (net.Conn, error) { return conn, nil }
