package protocol

import (
	"errors"
	"sync/atomic"
)

// helloRoom is what the control stream may carry before the hub has read the hello: a
// hello at its largest, and its length prefix.
const helloRoom = 4 + MaxHelloSize

// ErrExtraStream is the read error of the hub's tunnel whose agent opened a stream
// besides the control stream; the tunnel is closed.
var ErrExtraStream = errors.New("protocol: the agent opened a stream besides the control stream")

// ErrBeforeHello is the read error of the hub's tunnel whose agent sent more on the
// control stream, before the hub read its hello, than a hello may be; the tunnel is
// closed.
var ErrBeforeHello = errors.New("protocol: the agent sent more than a hello before the hub read its hello")

// streamGuard holds an agent to the streams the protocol lets it use, on the hub's
// side. yamux gives every stream a window of 256 KiB from its first frame, and no
// setting makes it smaller: without the guard, an agent could have the hub hold that
// much on the control stream before its hello, against the MaxHelloSize a hello may be,
// and as much again on each stream it opens that the hub never accepts, up to the
// accept backlog, for as long as the tunnel lives.
type streamGuard struct {
	opened    bool   // the agent opened the control stream
	control   uint32 // its ID
	early     uint32 // bytes of data it carried before the hello was read; at most helloRoom
	helloRead atomic.Bool
}

// frame judges the header of a frame the agent sent, before yamux reads the frame.
func (g *streamGuard) frame(typ byte, flags uint16, id, length uint32) error {
	// Only data and window updates open streams; a ping's SYN asks for an answer.
	if flags&yamuxSYN != 0 && (typ == yamuxData || typ == yamuxWindowUpdate) {
		if g.opened {
			return ErrExtraStream
		}
		g.opened, g.control = true, id
	}
	if typ != yamuxData || !g.opened || id != g.control || g.helloRead.Load() {
		// Other data is of a stream the hub opened, which it reads, or of none, which
		// yamux passes over without holding it.
		return nil
	}
	// The length is the peer's word, up to 4 GiB: compared, never added, before it is
	// known to fit.
	if length > helloRoom-g.early {
		return ErrBeforeHello
	}
	g.early += length
	return nil
}
