package protocol

import (
	"fmt"
	"io"
)

// StreamKind is the first byte of every stream the hub opens, saying what the rest of
// the stream carries. The agent closes a stream of a kind it does not serve.
type StreamKind byte

// StreamProxy carries HTTP/1.1 requests of the hub's Kubernetes API proxy (from
// ProxyVersion on): the agent forwards each to its worker's API server under its own,
// narrow identity, and streams the answer back.
const StreamProxy StreamKind = 'P'

func (k StreamKind) String() string {
	if k == StreamProxy {
		return "proxy"
	}
	return fmt.Sprintf("unknown(%#x)", byte(k))
}

// WriteStreamKind starts a stream the hub opened.
func WriteStreamKind(w io.Writer, k StreamKind) error {
	if _, err := w.Write([]byte{byte(k)}); err != nil {
		return fmt.Errorf("protocol: starting a %s stream: %w", k, err)
	}
	return nil
}

// ReadStreamKind reads what a stream the hub opened carries.
func ReadStreamKind(r io.Reader) (StreamKind, error) {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("protocol: reading a stream's kind: %w", err)
	}
	return StreamKind(b[0]), nil
}
