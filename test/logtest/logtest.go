// Package logtest is a log destination that a test shares with the code it runs: safe
// for concurrent writers, and read back whole for assertions.
package logtest

import (
	"bytes"
	"log/slog"
	"sync"
)

// Buffer collects what is written to it. The zero value is ready to use.
type Buffer struct {
	// Max, when positive, keeps only the latest Max bytes: for the logs of components
	// that write a lot (a Kueue manager, a hub and its agents over a long test), of which
	// a failing test shows the end.
	Max int

	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if over := b.buf.Len() - b.Max; b.Max > 0 && over > 0 {
		b.buf.Next(over)
	}
	return n, err
}

// Last is the last n bytes written, or all of them when fewer.
func (b *Buffer) Last(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	bs := b.buf.Bytes()
	if len(bs) > n {
		bs = bs[len(bs)-n:]
	}
	return string(bs)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Logger is a structured text logger that writes to b.
func (b *Buffer) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
