// Package brokerfaults proves that faults the broker itself raises, rather
// than the network, are reported to the application and never hang it, in
// each read mode (upstream, legacy and drainer). Its tests need a real
// RabbitMQ with the management plugin, and run only when the reliability
// suite is enabled (see package level):
//
//   - TestForcedClose: the broker force-closes the connection, through the
//     management API (DELETE /api/connections/{name}) and, where
//     rabbitmqctl is available, rabbitmqctl close_connection. NotifyClose
//     gets the broker's *amqp.Error, 320 CONNECTION_FORCED, marked Server
//     and not Recover, as upstream reports it; every later RPC, publish
//     and Channel call fails with an error matching amqp.ErrClosed; Close
//     returns at once; no goroutine is left behind.
//   - TestMemoryAlarm: a memory alarm (vm_memory_high_watermark 0, set with
//     rabbitmqctl, or the command in RABBITMQCTL) makes the broker block
//     each connection that publishes and stop reading its socket.
//     NotifyBlocked fires with Active=true, and with Active=false once the
//     watermark is restored. A blocked publisher's publishes still return
//     until the socket buffers fill (a few MiB), and then one waits for
//     the broker. Two behaviours are recorded per mode and asserted as
//     they are. Once connection.blocked has arrived, PublishWithContext
//     in the drainer and legacy modes waits, writing nothing, and returns
//     at its ctx's end; upstream's writes, and then blocks in the socket
//     write past its deadline. Upstream's Close waits for close-ok until
//     the alarm ends, where the drainer and legacy modes give up after
//     their CloseTimeout.
//   - TestPublishWithContextWaitsOutABlock: the same hold, against a fake
//     peer that sends connection.blocked and keeps reading, so that what
//     held the publish is the client and not the socket.
//   - TestDeletedQueue: another connection deletes the queue that
//     consumers on two channels read. The broker's basic.cancel reaches
//     NotifyCancel with each consumer tag, each deliveries chan closes,
//     and the channels stay open and usable.
//
// In legacy mode each test runs the drain loop such an application needs:
// nothing reads the socket unless the application calls in.
//
// Each bounded step's measured time is logged (go test -v) per mode.
//
// The memory alarm stops every publisher on the broker, so this package
// must not run beside other tests that use the same broker; the alarm is
// lifted in t.Cleanup, before any failure is reported, and by a watchdog
// should the test hang.
package brokerfaults
