// Package drainer will hold the dedicated-drainer read mode: one goroutine
// per connection owns the socket read, dispatches without ever blocking on
// user code, sends heartbeats from the same loop, and releases every waiter
// at once on an error.
//
// Status: not implemented yet. The read-path seam it plugs into
// (amqp091.Config.ReadPath, see PATCHES.md) is in place; until this mode
// lands, every connection runs upstream's reader.
package drainer
