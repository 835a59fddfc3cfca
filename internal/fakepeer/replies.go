package fakepeer

import "fmt"

// Replies to the synchronous methods that encode.go has no encoder for,
// so that a script can answer every RPC of the client, and Incoming, for
// scripts that answer on timers of their own.

// Class IDs beyond those of encode.go.
const (
	classExchange = 40
	classTx       = 90
)

// ExchangeDeclareOk returns exchange.declare-ok, the answer to
// exchange.declare (passive or not).
func ExchangeDeclareOk(channel uint16) []byte {
	return MethodFrame(channel, classExchange, 11, nil)
}

// ExchangeDeleteOk returns exchange.delete-ok, the answer to
// exchange.delete.
func ExchangeDeleteOk(channel uint16) []byte {
	return MethodFrame(channel, classExchange, 21, nil)
}

// ExchangeBindOk returns exchange.bind-ok, the answer to exchange.bind.
func ExchangeBindOk(channel uint16) []byte {
	return MethodFrame(channel, classExchange, 31, nil)
}

// ExchangeUnbindOk returns exchange.unbind-ok, the answer to
// exchange.unbind (method 51, not 41: 41 is unassigned in 0-9-1).
func ExchangeUnbindOk(channel uint16) []byte {
	return MethodFrame(channel, classExchange, 51, nil)
}

// QueueBindOk returns queue.bind-ok, the answer to queue.bind.
func QueueBindOk(channel uint16) []byte {
	return MethodFrame(channel, classQueue, 21, nil)
}

// QueueUnbindOk returns queue.unbind-ok, the answer to queue.unbind.
func QueueUnbindOk(channel uint16) []byte {
	return MethodFrame(channel, classQueue, 51, nil)
}

// QueuePurgeOk returns queue.purge-ok, the answer to queue.purge, with
// the number of messages purged.
func QueuePurgeOk(channel uint16, messageCount uint32) []byte {
	return MethodFrame(channel, classQueue, 31, new(Args).Long(messageCount).Bytes())
}

// QueueDeleteOk returns queue.delete-ok, the answer to queue.delete, with
// the number of messages deleted.
func QueueDeleteOk(channel uint16, messageCount uint32) []byte {
	return MethodFrame(channel, classQueue, 41, new(Args).Long(messageCount).Bytes())
}

// BasicGetOk returns basic.get-ok followed by the message's content
// frames, split at frameMax as Content does.
func BasicGetOk(channel uint16, deliveryTag uint64, redelivered bool, exchange, routingKey string, messageCount uint32, body []byte, frameMax uint32) []byte {
	args := new(Args).LongLong(deliveryTag).Bits(redelivered).ShortStr(exchange).ShortStr(routingKey).Long(messageCount)
	b := MethodFrame(channel, classBasic, 71, args.Bytes())
	return append(b, Content(channel, body, frameMax)...)
}

// BasicGetEmpty returns basic.get-empty, the answer to basic.get on an
// empty queue.
func BasicGetEmpty(channel uint16) []byte {
	return MethodFrame(channel, classBasic, 72, new(Args).ShortStr("").Bytes())
}

// BasicRecoverOk returns basic.recover-ok, the answer to basic.recover.
func BasicRecoverOk(channel uint16) []byte {
	return MethodFrame(channel, classBasic, 111, nil)
}

// TxSelectOk returns tx.select-ok, the answer to tx.select.
func TxSelectOk(channel uint16) []byte { return MethodFrame(channel, classTx, 11, nil) }

// TxCommitOk returns tx.commit-ok, the answer to tx.commit.
func TxCommitOk(channel uint16) []byte { return MethodFrame(channel, classTx, 21, nil) }

// TxRollbackOk returns tx.rollback-ok, the answer to tx.rollback.
func TxRollbackOk(channel uint16) []byte { return MethodFrame(channel, classTx, 31, nil) }

// ChannelFlowOk returns channel.flow-ok, the answer to the client's
// channel.flow, confirming the flow state it asked for.
func ChannelFlowOk(channel uint16, active bool) []byte {
	return MethodFrame(channel, classChannel, channelFlow+1, new(Args).Bits(active).Bytes())
}

// ConnectionUpdateSecretOk returns connection.update-secret-ok, the
// answer to connection.update-secret.
func ConnectionUpdateSecretOk() []byte {
	return MethodFrame(0, classConnection, 71, nil)
}

// Incoming starts a goroutine, owned by the peer, that reads the
// client's frames with ReadFrame (heartbeats included, under the peer's
// I/O timeout) and passes them on in order, so that a script can wait in
// one select for the client's next frame and for timers of its own, such
// as a reply it answers late. The chan is closed after the first read
// error, which the returned func reports once the chan is closed (nil
// before). From the call on the script must not read itself (ReadFrame,
// ExpectMethod, the Answer methods, StopReading); it still writes (Send,
// SendSlices) from its own goroutine. A script that returns nil must
// first receive from the chan until it is closed (the client closed the
// socket, say), since the peer reads the connection itself after such a
// script. Shutdown ends the goroutine with the connection, and waits for
// it as it waits for the scripts.
func (s *Session) Incoming() (<-chan Frame, func() error) {
	frames := make(chan Frame)
	ended := make(chan struct{})
	var readErr error
	s.p.wg.Add(1)
	go func() {
		defer s.p.wg.Done()
		defer close(frames)
		defer close(ended)
		for {
			f, err := s.ReadFrame()
			if err != nil {
				readErr = err
				return
			}
			select {
			case frames <- f:
			case <-s.p.done:
				readErr = fmt.Errorf("fakepeer: Incoming: the peer shut down")
				return
			}
		}
	}()
	return frames, func() error {
		select {
		case <-ended:
			return readErr
		default:
			return nil
		}
	}
}
