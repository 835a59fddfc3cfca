// Package legacyread will hold the caller-drives-read mode, in the style of
// py-amqp, rabbitmq-c and pika's BlockingConnection: no background
// goroutines, one transport lock, and frames read only while the
// application calls in (DrainEvents, an RPC, a publish).
//
// Status: not implemented yet. The read-path seam it plugs into
// (amqp091.Config.ReadPath, see PATCHES.md) is in place; until this mode
// lands, every connection runs upstream's reader.
package legacyread
