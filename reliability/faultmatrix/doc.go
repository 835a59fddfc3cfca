// Package faultmatrix injects seven network faults through Toxiproxy
// (reset_peer, a timeout blackhole, 200 ms latency with jitter, 16 KB/s
// bandwidth, slicer, limit_data and the proxy going down) during five
// phases of a connection's life (idle, publishing with confirms,
// consuming, an RPC in flight and a Close in progress), in each read mode
// (upstream, drainer, and legacy with a drain loop).
//
// In every cell it asserts that every call returns within a stated bound,
// that the error is the right kind (none for a fault the connection
// survives; an *amqp.Error or amqp.ErrClosed, never a context deadline or
// ErrClosedIntentionally, for one it does not), and that no goroutine is
// left behind. TestFaultMatrix prints the matrix, each cell with its
// verdict and the slowest call.
//
// Its tests run under scripts/reliability only; see package
// reliability/internal/level.
package faultmatrix
