package tunnel_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
)

// window is the window yamux gives every stream from its first frame, and what an agent
// could have the hub hold on each stream, unread, without the tunnel's rules.
const window = 256 << 10

// cutOff waits for the hub to close p's tunnel for the rule refused names, and checks
// that the hub says so and no longer counts the agent as connected.
func (h *hub) cutOff(t *testing.T, c *cluster, p *peer, refused error) {
	t.Helper()
	eventually(t, "the hub closed the tunnel", func() (bool, string) { return p.tunnel.IsClosed(), "it is open" })
	eventually(t, "the hub says why", func() (bool, string) {
		log := h.log.String()
		return strings.Contains(log, "broke the protocol") && strings.Contains(log, refused.Error()), "the log does not say so"
	})
	eventually(t, c.identity+" disconnected", func() (bool, string) { return !h.srv.Connected(c.identity), "connected" })
}

// An agent whose control stream carries more than a hello before the hub read its hello
// is cut off as the frame that carries it arrives: nothing of it is held. Here, a hello
// as large as may be and then heartbeats, in one frame of the stream's window, which
// the hub would otherwise hold whole before it read the hello.
func TestAnAgentThatSendsMoreThanAHelloBeforeItsHelloIsCutOff(t *testing.T) {
	// The hub waits long for a hello: the tunnel closing within the test's patience is
	// the bound at work, not the handshake timeout.
	h := startHub(t, nil, func(o *tunnel.Options) { o.HandshakeTimeout = 10 * time.Minute })
	c := newCluster(t, "early")
	p := h.connect(t, request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()}, false)

	var early bytes.Buffer
	framed := protocol.NewConn(&early)
	hello := &protocol.Hello{Identity: c.identity}
	if err := framed.Send(protocol.TypeHello, hello); err != nil {
		t.Fatal(err)
	}
	hello.AgentVersion = strings.Repeat("v", protocol.MaxHelloSize-(early.Len()-4))
	early.Reset()
	if err := framed.Send(protocol.TypeHello, hello); err != nil {
		t.Fatal(err)
	}
	for early.Len() < window-1024 {
		if err := framed.Send(protocol.TypeHeartbeat, &protocol.Heartbeat{Time: time.Now().UTC()}); err != nil {
			t.Fatal(err)
		}
	}
	// The hub may close the tunnel before this side learns that its write went out.
	_, _ = p.stream.Write(early.Bytes())
	h.cutOff(t, c, p, protocol.ErrBeforeHello)
}

// The protocol has the agent open the control stream and no other stream: one it opens
// besides is one the hub never accepts, and whose window's worth it would hold for as
// long as the tunnel lives. The agent is cut off as it opens it.
func TestAnAgentThatOpensAStreamTheHubNeverAcceptsIsCutOff(t *testing.T) {
	h := startHub(t, nil, nil)
	c := newCluster(t, "streams")
	p := h.enroll(t, c)
	for range 4 {
		st, err := p.tunnel.OpenStream()
		if err != nil {
			break // the hub closed the tunnel already
		}
		// The hub may close the tunnel before this side learns that its write went out.
		_, _ = st.Write(make([]byte, window))
	}
	h.cutOff(t, c, p, protocol.ErrExtraStream)
}
