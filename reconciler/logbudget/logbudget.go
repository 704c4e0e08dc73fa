// Package logbudget bounds the log lines that requests from outside the hub can cause.
// Whoever reaches one of the hub's listeners (an agent's tunnel, the API proxy, a
// forge's webhook) can send it garbage as fast as the network carries it; each refusal
// is worth a line to the operator, but a flood of them must not become a flood of log
// lines, nor hide the hub's own faults, which are logged within a budget of their own.
package logbudget

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultPerSecond is how many lines a Budget lets through each second unless told.
const DefaultPerSecond = 20

// Budget lets PerSecond lines through each second and counts the rest; the first line
// logged after some were skipped is preceded by one saying how many. The zero value is
// ready to use, with DefaultPerSecond. A Budget may be shared by several callers: they
// then share its lines.
type Budget struct {
	// PerSecond is set before first use; zero means DefaultPerSecond.
	PerSecond int

	mu      sync.Mutex
	second  time.Time
	n       int
	skipped int
}

// Log logs msg at level through log when the budget allows it now.
func (b *Budget) Log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	ok, skipped := b.take(time.Now())
	if !ok {
		return
	}
	if skipped > 0 {
		log.Warn("requests not logged: more arrived than the log takes", "count", skipped, "level", level)
	}
	// The request's context may be gone; the line is about it, not bound to it.
	log.Log(context.Background(), level, msg, args...)
}

// take reports whether a line may be logged at now, and how many were skipped since the
// last one that was.
func (b *Budget) take(now time.Time) (bool, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sec := now.Truncate(time.Second); !sec.Equal(b.second) {
		b.second, b.n = sec, 0
	}
	if b.n >= cmpOr(b.PerSecond, DefaultPerSecond) {
		b.skipped++
		return false, 0
	}
	b.n++
	skipped := b.skipped
	b.skipped = 0
	return true, skipped
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
