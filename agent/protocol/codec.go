package protocol

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MaxMessageSize bounds one control message. A desired state of a few hundred Kueue
// objects is well below it; anything larger is hostile or broken.
const MaxMessageSize = 8 << 20

// MaxHelloSize bounds the messages a receiver reads before it knows its peer: the hub
// reads the agent's hello under it, so a connection that authenticated but has not yet
// said who it is cannot make the hub hold more than this for it.
const MaxHelloSize = 64 << 10

// firstChunk is the buffer a message body starts in; it grows as bytes arrive.
const firstChunk = 4 << 10

// ErrTooLarge is returned for a message over the size cap; the stream cannot be read
// further, since the rest of the message would be taken for the next one.
var ErrTooLarge = errors.New("protocol: message larger than the size cap")

// ErrUnknownType and ErrNewerVersion are what Decode reports for a well-formed message
// the receiver cannot use: it answers the peer with an Error and reads on.
var (
	ErrUnknownType  = errors.New("protocol: unknown message type")
	ErrNewerVersion = errors.New("protocol: message of a newer protocol version")
)

// Conn reads and writes control messages on a stream. Reads and writes may happen
// concurrently with each other; concurrent writes are serialized.
type Conn struct {
	r            *bufio.Reader
	w            io.Writer
	max          atomic.Int64
	writeTimeout atomic.Int64 // nanoseconds; 0 for none
	version      atomic.Int64 // stamped on sent messages

	wmu sync.Mutex
}

// NewConn frames messages on rw with the default size cap.
func NewConn(rw io.ReadWriter) *Conn {
	c := &Conn{r: bufio.NewReaderSize(rw, 512), w: rw}
	c.max.Store(MaxMessageSize)
	c.version.Store(ProtocolVersion)
	return c
}

// SetVersion sets the version stamped on sent messages: the negotiated one, so that a
// peer speaking an older version reads them. Default ProtocolVersion.
func (c *Conn) SetVersion(v int) { c.version.Store(int64(v)) }

// SetMaxMessageSize changes the size cap of both directions: MaxHelloSize until the
// peer is known, less for peers that agreed on less, and in tests.
func (c *Conn) SetMaxMessageSize(n int) { c.max.Store(int64(n)) }

// SetWriteTimeout bounds each Send when the stream has write deadlines (as yamux
// streams do): a peer that stops reading fails the Send after d instead of blocking
// the sender forever once the stream's window is full. The error is then a net.Error
// whose Timeout() is true. Zero means no bound.
func (c *Conn) SetWriteTimeout(d time.Duration) { c.writeTimeout.Store(int64(d)) }

// deadliner is a stream that can bound its writes.
type deadliner interface{ SetWriteDeadline(time.Time) error }

// Send writes one message.
func (c *Conn) Send(typ string, body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("protocol: encoding %s: %w", typ, err)
	}
	data, err := json.Marshal(Envelope{Version: int(c.version.Load()), Type: typ, Body: raw})
	if err != nil {
		return fmt.Errorf("protocol: encoding %s: %w", typ, err)
	}
	if int64(len(data)) > c.max.Load() {
		return fmt.Errorf("protocol: %s of %d bytes: %w", typ, len(data), ErrTooLarge)
	}
	frame := make([]byte, 4+len(data))
	binary.BigEndian.PutUint32(frame, uint32(len(data)))
	copy(frame[4:], data)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if d, ok := c.w.(deadliner); ok {
		var deadline time.Time
		if t := time.Duration(c.writeTimeout.Load()); t > 0 {
			deadline = time.Now().Add(t)
		}
		_ = d.SetWriteDeadline(deadline)
	}
	if _, err := c.w.Write(frame); err != nil {
		return fmt.Errorf("protocol: sending %s: %w", typ, err)
	}
	return nil
}

// Receive reads the next message. A message of a known type comes back as its body
// type (*Hello, *DesiredState, ...). ErrUnknownType and ErrNewerVersion leave the
// stream usable; ErrTooLarge and read errors do not.
func (c *Conn) Receive() (*Envelope, any, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return nil, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > c.max.Load() {
		return nil, nil, fmt.Errorf("protocol: message of %d bytes: %w", n, ErrTooLarge)
	}
	data, err := readBody(c.r, int(n))
	if err != nil {
		return nil, nil, fmt.Errorf("protocol: reading a message of %d bytes: %w", n, err)
	}
	env := new(Envelope)
	if err := json.Unmarshal(data, env); err != nil {
		return nil, nil, &MalformedError{Err: err}
	}
	if env.Version > ProtocolVersion {
		return env, nil, fmt.Errorf("%w: %s of version %d, this side speaks %d", ErrNewerVersion, Clip(env.Type), env.Version, ProtocolVersion)
	}
	body := newBody(env.Type)
	if body == nil {
		return env, nil, fmt.Errorf("%w %q", ErrUnknownType, Clip(env.Type))
	}
	if len(env.Body) > 0 {
		if err := json.Unmarshal(env.Body, body); err != nil {
			return env, nil, &MalformedError{Type: env.Type, Err: err}
		}
	}
	return env, body, nil
}

// maxClip is how much of a text the peer chose an error or a log line carries.
const maxClip = 128

// Clip is s as an error or a log line may carry text the peer chose: at most maxClip
// bytes of it, and how long it was past them. A peer must not write the other side's
// log at the rate of its link.
func Clip(s string) string { return ClipTo(s, maxClip) }

// ClipTo is Clip with a bound of n bytes, for text that must say more than a log line:
// what a report tells of one object.
func ClipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", strings.ToValidUTF8(s[:n], ""), len(s))
}

// readBody reads n bytes into a buffer that grows as they arrive, never past n: the
// length prefix is the peer's claim, and a peer that claims megabytes and sends nothing
// must cost next to nothing.
func readBody(r io.Reader, n int) ([]byte, error) {
	buf := make([]byte, 0, min(n, firstChunk))
	for len(buf) < n {
		if len(buf) == cap(buf) {
			// Doubling keeps the copies linear in what arrived.
			buf = slices.Grow(buf, min(len(buf), n-len(buf)))
		}
		m, err := r.Read(buf[len(buf):min(cap(buf), n)])
		buf = buf[:len(buf)+m]
		if err != nil && len(buf) < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return buf, nil
}

// MalformedError is a message that is not valid JSON of its type. The frame was read
// whole, so the stream stays usable.
type MalformedError struct {
	Type string
	Err  error
}

func (e *MalformedError) Error() string {
	if e.Type == "" {
		return "protocol: malformed message: " + e.Err.Error()
	}
	return fmt.Sprintf("protocol: malformed %s message: %v", e.Type, e.Err)
}

func (e *MalformedError) Unwrap() error { return e.Err }

// Recoverable reports whether err from Receive leaves the stream readable: the peer
// sent something this side refuses, which it answers with RefusalFor(err).
func Recoverable(err error) bool {
	var m *MalformedError
	return errors.Is(err, ErrUnknownType) || errors.Is(err, ErrNewerVersion) || errors.As(err, &m)
}

// RefusalFor is the Error message answering a recoverable receive error.
func RefusalFor(err error) *Error {
	var m *MalformedError
	switch {
	case errors.Is(err, ErrUnknownType):
		return &Error{Code: CodeUnknownType, Message: err.Error()}
	case errors.Is(err, ErrNewerVersion):
		return &Error{Code: CodeUnsupportedVersion, Message: err.Error()}
	case errors.As(err, &m):
		return &Error{Code: CodeMalformed, Message: err.Error()}
	}
	return &Error{Code: CodeMalformed, Message: err.Error()}
}

func newBody(typ string) any {
	switch typ {
	case TypeHello:
		return new(Hello)
	case TypeDesired:
		return new(DesiredState)
	case TypeApplied:
		return new(Applied)
	case TypeInventory:
		return new(Inventory)
	case TypeHeartbeat:
		return new(Heartbeat)
	case TypeRotateCredential:
		return new(RotateCredential)
	case TypeCredentialStored:
		return new(CredentialStored)
	case TypeError:
		return new(Error)
	}
	return nil
}
