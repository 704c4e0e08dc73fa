package protocol

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/hashicorp/yamux"

	"github.com/flotilla-gitops/flotilla/test/poll"
)

// yamuxWindow is the window yamux gives every stream from its first frame, and what an
// agent could have the hub hold on each stream without the guard.
const yamuxWindow = 256 << 10

// send writes frames to the hub as one WebSocket message.
func send(t *testing.T, ws *websocket.Conn, frames ...[]byte) {
	t.Helper()
	if err := ws.WriteMessage(websocket.BinaryMessage, bytes.Join(frames, nil)); err != nil {
		t.Fatal(err)
	}
}

// sendRefused writes frames the hub may close the tunnel for before it took them whole.
func sendRefused(ws *websocket.Conn, frames ...[]byte) {
	_ = ws.WriteMessage(websocket.BinaryMessage, bytes.Join(frames, nil))
}

// cutOff waits for the hub to close tun, and checks that it did for want.
func cutOff(t *testing.T, tun *Tunnel, want error) {
	t.Helper()
	poll.Until(t, "the tunnel closed", func() (bool, string) { return tun.IsClosed(), "it is open" })
	if err := tun.Refused(); !errors.Is(err, want) {
		t.Fatalf("the tunnel closed for %v, want %v", err, want)
	}
}

// acceptAndRead accepts the agent's control stream and reads n bytes of it.
func acceptAndRead(t *testing.T, tun *Tunnel, n int) *yamux.Stream {
	t.Helper()
	st, err := tun.AcceptStreamWithContext(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(st, make([]byte, n)); err != nil {
		t.Fatalf("reading %d bytes of the control stream: %v", n, err)
	}
	return st
}

// Before the hub read its hello, an agent may put no more on the control stream than a
// hello may be, with its length prefix: yamux's window would let it make the hub hold
// four times that for a connection that has not said who it is.
func TestAnAgentThatSendsMoreThanAHelloBeforeItsHelloIsCutOff(t *testing.T) {
	t.Run("a hello's worth, then a byte more", func(t *testing.T) {
		tun, ws := hubSide(t)
		half := helloRoom / 2
		send(t, ws, yamuxFrame(yamuxWindowUpdate, yamuxSYN, 1, 0, nil), yamuxFrame(yamuxData, 0, 1, uint32(half), make([]byte, half)))
		send(t, ws, yamuxFrame(yamuxData, 0, 1, uint32(helloRoom-half), make([]byte, helloRoom-half)))
		// The hub holds all of it: the bound is a hello's worth, not less.
		acceptAndRead(t, tun, helloRoom)
		if tun.IsClosed() {
			t.Fatalf("a hello's worth closed the tunnel: %v", tun.Refused())
		}
		sendRefused(ws, yamuxFrame(yamuxData, 0, 1, 1, []byte{'x'}))
		cutOff(t, tun, ErrBeforeHello)
	})
	t.Run("a window's worth in one frame", func(t *testing.T) {
		tun, ws := hubSide(t)
		// Cut off as the header announces it, before a byte of it is held.
		sendRefused(ws, yamuxFrame(yamuxData, yamuxSYN, 1, yamuxWindow, make([]byte, yamuxWindow)))
		cutOff(t, tun, ErrBeforeHello)
	})
	t.Run("once the hello is read, the rest of the window", func(t *testing.T) {
		tun, ws := hubSide(t)
		send(t, ws, yamuxFrame(yamuxData, yamuxSYN, 1, 100, make([]byte, 100)))
		st := acceptAndRead(t, tun, 100)
		tun.HelloRead()
		// yamux gives back the 100 bytes read only once half its window is read.
		rest := yamuxWindow - 100
		send(t, ws, yamuxFrame(yamuxData, 0, 1, uint32(rest), make([]byte, rest)))
		if _, err := io.ReadFull(st, make([]byte, rest)); err != nil {
			t.Fatalf("reading the rest of the window after the hello: %v", err)
		}
		if tun.IsClosed() {
			t.Fatalf("the tunnel closed after the hello: %v", tun.Refused())
		}
	})
}

// The protocol has the agent open the control stream and no other: a stream it opens
// besides is one the hub never accepts, and yamux would hold a window's worth of it for
// the tunnel's life, up to the accept backlog.
func TestAnAgentThatOpensAStreamBesidesTheControlStreamIsCutOff(t *testing.T) {
	for _, tc := range []struct {
		name  string
		typ   byte
		frame []byte
	}{
		{"with data", yamuxData, make([]byte, yamuxWindow)},
		{"with a window update", yamuxWindowUpdate, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tun, ws := hubSide(t)
			send(t, ws, yamuxFrame(yamuxData, yamuxSYN, 1, 100, make([]byte, 100)))
			acceptAndRead(t, tun, 100)
			tun.HelloRead()
			sendRefused(ws, yamuxFrame(tc.typ, yamuxSYN, 3, uint32(len(tc.frame)), tc.frame))
			cutOff(t, tun, ErrExtraStream)
		})
	}
}

// tunnelPair is a hub's and an agent's end of one tunnel, both as the protocol builds
// them.
func tunnelPair(t *testing.T) (hub, agent *Tunnel) {
	t.Helper()
	hub, ws := dialHub(t)
	agent, err := NewTunnel(ws, true, DefaultLiveness)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Close() })
	return hub, agent
}

// largestHello is a hello as large as a hello may be.
func largestHello(t *testing.T) *Hello {
	t.Helper()
	hello := &Hello{Identity: "worker"}
	var framed bytes.Buffer
	if err := NewConn(&framed).Send(TypeHello, hello); err != nil {
		t.Fatal(err)
	}
	hello.AgentVersion = strings.Repeat("v", MaxHelloSize-(framed.Len()-4))
	return hello
}

// What the protocol has an agent do stays within the hub's bounds: a hello as large as
// may be, whole messages after it, and the answers on as many streams as the hub opens.
func TestAnAgentThatKeepsToTheProtocolIsNeverCutOff(t *testing.T) {
	hub, agent := tunnelPair(t)
	control, err := agent.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	ac := NewConn(control)
	hello := largestHello(t)
	if err := ac.Send(TypeHello, hello); err != nil {
		t.Fatal(err)
	}
	st, err := hub.AcceptStreamWithContext(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	hc := NewConn(st)
	hc.SetMaxMessageSize(MaxHelloSize)
	if _, body, err := hc.Receive(); err != nil {
		t.Fatalf("reading the hello: %v", err)
	} else if got, ok := body.(*Hello); !ok || got.Identity != hello.Identity {
		t.Fatalf("read %#v, want the hello", body)
	}
	hub.HelloRead()
	hc.SetMaxMessageSize(MaxMessageSize)

	// A report larger than yamux's window, which it sends in more than one frame.
	report := &Applied{Hash: strings.Repeat("h", 1<<20)}
	go func() { _ = ac.Send(TypeApplied, report) }()
	if _, body, err := hc.Receive(); err != nil {
		t.Fatalf("reading the report: %v", err)
	} else if got, ok := body.(*Applied); !ok || got.Hash != report.Hash {
		t.Fatal("the report did not arrive whole")
	}

	const opened = 20 // more than yamux's accept backlog
	for i := range opened {
		hs, err := hub.OpenStream()
		if err != nil {
			t.Fatalf("opening stream %d: %v", i, err)
		}
		if err := WriteStreamKind(hs, StreamProxy); err != nil {
			t.Fatal(err)
		}
		as, err := agent.AcceptStreamWithContext(t.Context())
		if err != nil {
			t.Fatalf("accepting stream %d: %v", i, err)
		}
		if k, err := ReadStreamKind(as); err != nil || k != StreamProxy {
			t.Fatalf("stream %d is of kind %v (%v)", i, k, err)
		}
		answer := make([]byte, 4<<10)
		go func() { _, _ = as.Write(answer); _ = as.Close() }()
		if got, err := io.ReadAll(hs); err != nil || len(got) != len(answer) {
			t.Fatalf("stream %d answered %d bytes (%v), want %d", i, len(got), err, len(answer))
		}
		_ = hs.Close()
	}
	for side, tun := range map[string]*Tunnel{"hub": hub, "agent": agent} {
		if tun.IsClosed() {
			t.Fatalf("the %s's side closed the tunnel: %v", side, tun.Refused())
		}
	}
}
