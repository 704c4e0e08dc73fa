package protocol

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/flotilla-gitops/flotilla/test/poll"
)

// yamuxFrame is a yamux header followed by payload.
func yamuxFrame(typ byte, flags uint16, stream, length uint32, payload []byte) []byte {
	h := make([]byte, yamuxHeaderSize, yamuxHeaderSize+len(payload))
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:4], flags)
	binary.BigEndian.PutUint32(h[4:8], stream)
	binary.BigEndian.PutUint32(h[8:12], length)
	return append(h, payload...)
}

// hubSide is the hub's end of a tunnel, and a raw WebSocket to it that speaks yamux's
// frames by hand, as a hostile agent would.
func hubSide(t *testing.T) (*Tunnel, *websocket.Conn) {
	t.Helper()
	tun, ws := dialHub(t)
	// The answers are read, as a peer that floods and reads would.
	go func() {
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	}()
	return tun, ws
}

// dialHub is the hub's end of a tunnel, and the WebSocket dialled to it.
func dialHub(t *testing.T) (*Tunnel, *websocket.Conn) {
	t.Helper()
	tunnels := make(chan *Tunnel, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		tun, err := NewTunnel(ws, false, DefaultLiveness)
		if err != nil {
			_ = ws.Close()
			return
		}
		tunnels <- tun
	}))
	t.Cleanup(srv.Close)
	ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ws.Close() })
	tun := <-tunnels
	t.Cleanup(func() { _ = tun.Close() })
	return tun, ws
}

// A peer that asks for yamux pings faster than any peer needs is cut off: yamux answers
// each from a goroutine of its own, and one agent could otherwise grow the hub's
// goroutines without bound. Bytes of a stream's data that look like pings are data.
func TestAPeerThatFloodsPingsIsCutOff(t *testing.T) {
	t.Run("pings", func(t *testing.T) {
		tun, ws := hubSide(t)
		var flood []byte
		for i := range 10_000 {
			flood = append(flood, yamuxFrame(yamuxPing, yamuxSYN, 0, uint32(i), nil)...)
		}
		// The hub may cut it off before the message is written whole.
		_ = ws.WriteMessage(websocket.BinaryMessage, flood)
		poll.Until(t, "the tunnel closed", func() (bool, string) { return tun.IsClosed(), "it is open" })
	})
	t.Run("data that looks like pings", func(t *testing.T) {
		tun, ws := hubSide(t)
		var payload []byte
		for i := range 100 {
			payload = append(payload, yamuxFrame(yamuxPing, yamuxSYN, 0, uint32(i), nil)...)
		}
		// A new stream, whose first data holds them, cut across two messages.
		frame := yamuxFrame(yamuxData, yamuxSYN, 1, uint32(len(payload)), payload)
		for _, part := range [][]byte{frame[:700], frame[700:]} {
			if err := ws.WriteMessage(websocket.BinaryMessage, part); err != nil {
				t.Fatal(err)
			}
		}
		st, err := tun.AcceptStream()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(payload))
		if _, err := io.ReadFull(st, got); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("the stream read %v, %d bytes; want its data whole", err, len(got))
		}
		if tun.IsClosed() {
			t.Fatal("a stream's data was taken for pings")
		}
	})
}
