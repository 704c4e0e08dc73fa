package protocol

import (
	"encoding/binary"
	"errors"

	"golang.org/x/time/rate"
)

// yamux's frames, as its specification (spec.md) sets them: a 12-byte header of version,
// type, flags, stream ID and length, followed by length bytes of payload for a data
// frame only.
const (
	yamuxHeaderSize   = 12
	yamuxData         = 0
	yamuxWindowUpdate = 1
	yamuxPing         = 2
	yamuxSYN          = 1
)

// Pings a peer may ask for: neither side sends yamux pings of its own (the WebSocket's
// stand in for them), so these only leave room for a yamux that would.
const (
	pingRate  = 1 // a second
	pingBurst = 16
)

// ErrPingFlood is the read error of a tunnel whose peer asked for more yamux pings than
// a peer ever needs; the tunnel is closed.
var ErrPingFlood = errors.New("protocol: the peer sent yamux pings faster than it may")

// pingGuard follows the yamux frames a peer sends and refuses its pings past a rate.
// yamux answers each ping from a goroutine of its own that waits for room to send: a
// peer that sends pings faster than it reads the answers would grow the goroutines of
// the side it sends them to without bound, and a single agent could exhaust the hub.
// On the hub's side it hands every header to the agent's stream rules as well, since
// it is where the frames are followed.
type pingGuard struct {
	hdr     [yamuxHeaderSize]byte
	have    int    // bytes of hdr read
	skip    uint32 // bytes of a data frame's payload left to pass over
	asks    *rate.Limiter
	streams *streamGuard // nil on the agent's side
}

func newPingGuard(streams *streamGuard) *pingGuard {
	return &pingGuard{asks: rate.NewLimiter(pingRate, pingBurst), streams: streams}
}

// see follows p, the next bytes the peer sent.
func (g *pingGuard) see(p []byte) error {
	for len(p) > 0 {
		if g.skip > 0 {
			n := min(uint32(len(p)), g.skip)
			g.skip -= n
			p = p[n:]
			continue
		}
		n := copy(g.hdr[g.have:], p)
		g.have += n
		p = p[n:]
		if g.have < yamuxHeaderSize {
			return nil
		}
		g.have = 0
		flags, length := binary.BigEndian.Uint16(g.hdr[2:4]), binary.BigEndian.Uint32(g.hdr[8:12])
		if g.streams != nil {
			if err := g.streams.frame(g.hdr[1], flags, binary.BigEndian.Uint32(g.hdr[4:8]), length); err != nil {
				return err
			}
		}
		switch g.hdr[1] {
		case yamuxData:
			g.skip = length
		case yamuxPing:
			if flags&yamuxSYN != 0 && !g.asks.Allow() {
				return ErrPingFlood
			}
		}
	}
	return nil
}
