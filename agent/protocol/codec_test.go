package protocol_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

func frame(data []byte) []byte {
	out := make([]byte, 4+len(data))
	binary.BigEndian.PutUint32(out, uint32(len(data)))
	copy(out[4:], data)
	return out
}

func TestMessagesRoundTrip(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	send, recv := protocol.NewConn(a), protocol.NewConn(b)
	msgs := []struct {
		typ  string
		body any
	}{
		{protocol.TypeHello, &protocol.Hello{Identity: "7-example-gpu-a", AgentVersion: "v0.1.0", KubernetesVersion: "v1.37.2", AppliedHash: "sha256:ab"}},
		{protocol.TypeDesired, &protocol.DesiredState{Generation: 3, Hash: "sha256:cd", Objects: []json.RawMessage{json.RawMessage(`{"kind":"ClusterQueue"}`)}}},
		{protocol.TypeApplied, &protocol.Applied{Generation: 3, Hash: "sha256:cd", Results: []protocol.ObjectResult{{Kind: "ClusterQueue", Name: "cq", Action: protocol.ActionRefused, Message: "refuse to adopt"}}}},
		{protocol.TypeInventory, &protocol.Inventory{Totals: []protocol.ProductTotal{{Product: "NVIDIA-H100-80GB-HBM3", GPUs: 64, Nodes: 8}}}},
		{protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: "flt1_secret"}},
		{protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: "flt1_secret", ExpiresAt: time.Date(2027, 3, 4, 9, 30, 0, 0, time.UTC)}},
		{protocol.TypeError, &protocol.Error{Code: protocol.CodeUnknownType, Message: "x"}},
	}
	go func() {
		for _, m := range msgs {
			if err := send.Send(m.typ, m.body); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for _, m := range msgs {
		env, body, err := recv.Receive()
		if err != nil {
			t.Fatalf("%s: %v", m.typ, err)
		}
		if env.Type != m.typ || env.Version != protocol.ProtocolVersion {
			t.Fatalf("envelope %+v, want %s v%d", env, m.typ, protocol.ProtocolVersion)
		}
		if got, want := fmt.Sprintf("%#v", body), fmt.Sprintf("%#v", m.body); got != want {
			t.Fatalf("%s read back as %s, want %s", m.typ, got, want)
		}
	}
}

func TestReceiveRefusesWithoutLosingTheStream(t *testing.T) {
	hello, _ := json.Marshal(protocol.Envelope{Version: 1, Type: protocol.TypeHeartbeat, Body: json.RawMessage(`{}`)})
	tests := []struct {
		name        string
		data        []byte
		recoverable bool
		want        error
		code        string
	}{
		{"an unknown type", []byte(`{"v":1,"type":"teleport","body":{}}`), true, protocol.ErrUnknownType, protocol.CodeUnknownType},
		{"a newer version", []byte(`{"v":99,"type":"hello","body":{}}`), true, protocol.ErrNewerVersion, protocol.CodeUnsupportedVersion},
		{"not JSON", []byte(`{not json`), true, nil, protocol.CodeMalformed},
		{"a body of the wrong shape", []byte(`{"v":1,"type":"desired","body":{"generation":"three"}}`), true, nil, protocol.CodeMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in bytes.Buffer
			in.Write(frame(tt.data))
			in.Write(frame(hello))
			c := protocol.NewConn(&rw{r: &in})
			_, _, err := c.Receive()
			if err == nil || protocol.Recoverable(err) != tt.recoverable {
				t.Fatalf("Receive = %v, want a recoverable=%v error", err, tt.recoverable)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("Receive = %v, want %v", err, tt.want)
			}
			if code := protocol.RefusalFor(err).Code; code != tt.code {
				t.Fatalf("refusal code %s, want %s", code, tt.code)
			}
			// The next message is read as if nothing happened.
			if env, _, err := c.Receive(); err != nil || env.Type != protocol.TypeHeartbeat {
				t.Fatalf("the message after the refused one: %v, %v", env, err)
			}
		})
	}
}

func TestSizeCap(t *testing.T) {
	var in bytes.Buffer
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], protocol.MaxMessageSize+1)
	in.Write(hdr[:])
	c := protocol.NewConn(&rw{r: &in})
	if _, _, err := c.Receive(); !errors.Is(err, protocol.ErrTooLarge) || protocol.Recoverable(err) {
		t.Fatalf("Receive of an oversized frame = %v, want ErrTooLarge, not recoverable", err)
	}
	small := protocol.NewConn(&rw{r: &in, w: io.Discard})
	small.SetMaxMessageSize(64)
	if err := small.Send(protocol.TypeDesired, &protocol.DesiredState{Hash: strings.Repeat("x", 100)}); !errors.Is(err, protocol.ErrTooLarge) {
		t.Fatalf("Send over the cap = %v, want ErrTooLarge", err)
	}
}

func TestSecretsDoNotPrint(t *testing.T) {
	m := protocol.RotateCredential{Credential: "flt1_abcdefghijklmnopqrstuvwxyz"}
	for _, s := range []string{fmt.Sprint(m), fmt.Sprintf("%+v", m), fmt.Sprintf("%#v", m), fmt.Sprintf("%v", &m)} {
		if strings.Contains(s, "flt1_") {
			t.Fatalf("a formatted message shows the credential: %s", s)
		}
	}
	if data, _ := json.Marshal(m); !strings.Contains(string(data), "flt1_abc") {
		t.Fatal("the wire form lost the credential")
	}
}

// stalling gives its bytes, then blocks until released, as a peer that announced a
// message and sent only its beginning.
type stalling struct {
	data    []byte
	stalled chan struct{}
	release chan struct{}
}

func (r *stalling) Read(p []byte) (int, error) {
	if len(r.data) > 0 {
		n := copy(p, r.data)
		r.data = r.data[n:]
		return n, nil
	}
	close(r.stalled)
	<-r.release
	return 0, io.EOF
}

func TestReceiveAllocatesAsBytesArriveNotAsTheLengthPrefixClaims(t *testing.T) {
	const runs = 16
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		in := make([]byte, 4+100)
		binary.BigEndian.PutUint32(in, protocol.MaxMessageSize)
		r := &stalling{data: in, stalled: make(chan struct{}), release: make(chan struct{})}
		done := make(chan error, 1)
		go func() { _, _, err := protocol.NewConn(&rw{r: r}).Receive(); done <- err }()
		<-r.stalled // the peer sent 100 bytes of its 8 MiB and went quiet
		close(r.release)
		if err := <-done; !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("Receive of a message cut short = %v, want io.ErrUnexpectedEOF", err)
		}
	}
	runtime.ReadMemStats(&after)
	if perRun := (after.TotalAlloc - before.TotalAlloc) / runs; perRun > 64<<10 {
		t.Fatalf("a peer that announced %d bytes and sent 100 made the receiver allocate %d bytes", protocol.MaxMessageSize, perRun)
	}
}

func TestReceiveReadsMessagesOfEverySizeUpToTheCap(t *testing.T) {
	for _, n := range []int{0, 1, 4<<10 - 1, 4 << 10, 4<<10 + 1, 100 << 10, 1 << 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			body := &protocol.Hello{Identity: strings.Repeat("x", max(0, n-40))}
			var in bytes.Buffer
			send := protocol.NewConn(&rw{r: &bytes.Buffer{}, w: &in})
			if err := send.Send(protocol.TypeHello, body); err != nil {
				t.Fatal(err)
			}
			recv := protocol.NewConn(&rw{r: iotest.HalfReader(&in)})
			_, got, err := recv.Receive()
			if err != nil {
				t.Fatal(err)
			}
			if h, ok := got.(*protocol.Hello); !ok || h.Identity != body.Identity {
				t.Fatalf("read back %T with an identity of %d bytes, want %d", got, len(h.Identity), len(body.Identity))
			}
		})
	}
}

func TestSendGivesUpOnAPeerThatStopsReading(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := protocol.NewConn(a) // nobody reads b
	c.SetWriteTimeout(50 * time.Millisecond)
	err := c.Send(protocol.TypeHeartbeat, &protocol.Heartbeat{})
	if !protocol.IsWriteTimeout(err) {
		t.Fatalf("Send to a peer that reads nothing = %v, want a write timeout", err)
	}
}

func TestRedemptionKeys(t *testing.T) {
	k1, err := protocol.NewRedemptionKey()
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := protocol.NewRedemptionKey()
	if k1 == k2 {
		t.Fatal("two redemption keys are equal")
	}
	if fmt.Sprint(k1) != "[redacted]" {
		t.Fatal("a redemption key prints")
	}
	for _, k := range []string{k1.Reveal(), k2.Reveal()} {
		if !protocol.ValidRedemptionKey(k) {
			t.Fatalf("a drawn key is not valid: %d characters", len(k))
		}
	}
	for name, k := range map[string]string{
		"empty":             "",
		"short":             k1.Reveal()[:42],
		"long":              k1.Reveal() + "A",
		"not base64url":     strings.Repeat("+", 43),
		"non-canonical end": k1.Reveal()[:42] + "B", // a last character with stray low bits
		"a token":           "flt1_" + strings.Repeat("a", 59),
	} {
		if protocol.ValidRedemptionKey(k) {
			// "non-canonical end" is valid only when it happens to spell the same bits.
			if name == "non-canonical end" && k == k1.Reveal() {
				continue
			}
			t.Errorf("%s key accepted", name)
		}
	}
}

// FuzzReceive feeds arbitrary bytes to the control stream's reader: it must return an
// error or a message, never panic, and never allocate past the cap.
func FuzzReceive(f *testing.F) {
	f.Add(frame([]byte(`{"v":1,"type":"hello","body":{"identity":"x"}}`)))
	f.Add(frame([]byte(`{"v":1,"type":"desired","body":{"objects":[{}]}}`)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add(frame([]byte(`{"v":99,"type":"?"}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := protocol.NewConn(&rw{r: bytes.NewReader(data)})
		c.SetMaxMessageSize(1 << 16)
		for range 8 {
			_, _, err := c.Receive()
			if err != nil && !protocol.Recoverable(err) {
				return
			}
		}
	})
}

type rw struct {
	r io.Reader
	w io.Writer
}

func (x *rw) Read(p []byte) (int, error) { return x.r.Read(p) }
func (x *rw) Write(p []byte) (int, error) {
	if x.w == nil {
		return len(p), nil
	}
	return x.w.Write(p)
}

// A hub's rotation carries the new credential's expiry; an agent from before lifetimes
// reads the same message and finds only what it knows, and a hub from before them sends
// a rotation without one, which reads as no expiry.
func TestRotationExpiryIsReadByOlderAndNewerPeers(t *testing.T) {
	expires := time.Date(2027, 3, 4, 9, 30, 0, 0, time.UTC)
	data, err := json.Marshal(protocol.RotateCredential{Credential: "flt1_secret", ExpiresAt: expires})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"expiresAt":"2027-03-04T09:30:00Z"`) {
		t.Fatalf("the rotation's wire form %s lacks the expiry in RFC 3339", data)
	}
	// What an agent before lifetimes decodes a rotation into.
	var older struct {
		Credential protocol.Secret `json:"credential"`
	}
	if err := json.Unmarshal(data, &older); err != nil || older.Credential != "flt1_secret" {
		t.Fatalf("an older agent reads %+v (%v), want the credential alone", older, err)
	}
	old, _ := json.Marshal(older)
	if strings.Contains(string(old), "expiresAt") {
		t.Fatalf("a rotation without an expiry is sent as %s", old)
	}
	rotation := func(body []byte) []byte {
		env, _ := json.Marshal(protocol.Envelope{Version: 1, Type: protocol.TypeRotateCredential, Body: body})
		return frame(env)
	}
	var in bytes.Buffer
	in.Write(rotation(old))
	in.Write(rotation(data))
	c := protocol.NewConn(&rw{r: &in, w: io.Discard})
	for _, want := range []time.Time{{}, expires} {
		_, body, err := c.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if got := body.(*protocol.RotateCredential).ExpiresAt; !got.Equal(want) {
			t.Fatalf("the rotation reads with expiry %s, want %s", got, want)
		}
	}
}
