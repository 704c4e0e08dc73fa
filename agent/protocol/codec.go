package protocol

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// MaxMessageSize bounds one control message. A desired state of a few hundred Kueue
// objects is well below it; anything larger is hostile or broken.
const MaxMessageSize = 8 << 20

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
	r   *bufio.Reader
	w   io.Writer
	max int

	wmu sync.Mutex
}

// NewConn frames messages on rw with the default size cap.
func NewConn(rw io.ReadWriter) *Conn {
	return &Conn{r: bufio.NewReaderSize(rw, 512), w: rw, max: MaxMessageSize}
}

// SetMaxMessageSize changes the size cap, for tests and for peers that agreed on less.
func (c *Conn) SetMaxMessageSize(n int) { c.max = n }

// Send writes one message.
func (c *Conn) Send(typ string, body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("protocol: encoding %s: %w", typ, err)
	}
	data, err := json.Marshal(Envelope{Version: ProtocolVersion, Type: typ, Body: raw})
	if err != nil {
		return fmt.Errorf("protocol: encoding %s: %w", typ, err)
	}
	if len(data) > c.max {
		return fmt.Errorf("protocol: %s of %d bytes: %w", typ, len(data), ErrTooLarge)
	}
	frame := make([]byte, 4+len(data))
	binary.BigEndian.PutUint32(frame, uint32(len(data)))
	copy(frame[4:], data)
	c.wmu.Lock()
	defer c.wmu.Unlock()
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
	if int64(n) > int64(c.max) {
		return nil, nil, fmt.Errorf("protocol: message of %d bytes: %w", n, ErrTooLarge)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(c.r, data); err != nil {
		return nil, nil, fmt.Errorf("protocol: reading a message of %d bytes: %w", n, err)
	}
	env := new(Envelope)
	if err := json.Unmarshal(data, env); err != nil {
		return nil, nil, &MalformedError{Err: err}
	}
	if env.Version > ProtocolVersion {
		return env, nil, fmt.Errorf("%w: %s of version %d, this side speaks %d", ErrNewerVersion, env.Type, env.Version, ProtocolVersion)
	}
	body := newBody(env.Type)
	if body == nil {
		return env, nil, fmt.Errorf("%w %q", ErrUnknownType, env.Type)
	}
	if len(env.Body) > 0 {
		if err := json.Unmarshal(env.Body, body); err != nil {
			return env, nil, &MalformedError{Type: env.Type, Err: err}
		}
	}
	return env, body, nil
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
