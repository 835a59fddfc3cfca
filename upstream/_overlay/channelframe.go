// amqp091-drainer's overlay on amqp091-go, not upstream code: see PATCHES.md.

package amqp091

import "fmt"

// chanStep is what a frame on channel ≠ 0 comes to, for the mode's handOn: at most one
// field after ch is set. A content's method, header and body frames come to one step with
// del or msg set, once the last body frame is read; until then their steps are empty.
type chanStep struct {
	ch     *Channel           // nil: the channel is not open
	closed frame              // a method for a channel not open, as upstream parsed it
	method *methodFrame       // a method that starts no content
	del    *Delivery          // a complete basic.deliver from the fast path
	msg    messageWithContent // any other complete content message
}

// channelFrame is upstream's dispatchN up to the channel's dispatch, for raw on channel
// id ≠ 0: a dispatch sees only whole messages and methods that start no content.
//
// Why content is assembled here, by the read turn's holder, and not by the channel as
// upstream's recvMethod/recvHeader/recvContent do: in the drainer one job per message,
// not three or more per frame, is queued for a dispatcher, and a ConsumeFunc's delivery
// is whole when it lands in its inbox. The rules are upstream's (fastread.go's drift
// guards name them), so a channel's state machine only ever sees methods.
//
// updateChannel runs under c.m, as upstream's reader runs it: a channel.close marks the
// channel closed as soon as it is read, before its dispatch runs, which in the drainer
// may be later, on the channel's dispatcher.
func (cr *contentReader) channelFrame(c *Connection, split *frameSplitter, id uint16,
	raw []byte) (chanStep, *Error) {
	cf, err := cr.decode(split, raw)
	if err != nil {
		return chanStep{}, &Error{Code: FrameError, Reason: fmt.Sprintf("malformed frame: %v", err)}
	}
	c.m.Lock()
	ch, ok := c.channels[id]
	if ok && cf.f != nil {
		updateChannel(cf.f, ch)
	}
	c.m.Unlock()
	step := chanStep{ch: ch}
	if !ok {
		Logger.Printf("[debug] dropping frame, channel %d does not exist", id)
		if raw[0] == frameMethod {
			step.closed = cf.f
			if cf.f == nil { // decoded fast: upstream's parse succeeds too
				step.closed, _ = split.parse(raw)
			}
		}
		return step, nil
	}
	a := cr.asm(id, ch)
	var complete bool // never with a method
	complete, step.method = cr.feed(a, &cf, c.maxFrameSize.Load())
	if complete {
		step.del, step.msg = a.complete()
	}
	return step, nil
}
