package tunnel

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logRefusal logs a refused request within the budget: a flood of garbage must not
// become a flood of log lines.
func (s *Server) logRefusal(log *slog.Logger, level slog.Level, msg string, args ...any) {
	logWithin(&s.refusals, log, level, msg, args...)
}

// logFault logs a request the hub could not admit through a fault of its own, within a
// budget of its own: a flood of garbage never hides the hub's faults from its operators.
func (s *Server) logFault(log *slog.Logger, msg string, args ...any) {
	logWithin(&s.faults, log, slog.LevelError, msg, args...)
}

func logWithin(b *logBudget, log *slog.Logger, level slog.Level, msg string, args ...any) {
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

// refusalsPerSecond is how many refused requests are logged each second.
const refusalsPerSecond = 20

// logBudget lets refusalsPerSecond log lines through each second and counts the rest.
type logBudget struct {
	mu      sync.Mutex
	second  time.Time
	n       int
	skipped int
}

// take reports whether a line may be logged now, and how many were skipped since the
// last one that was.
func (b *logBudget) take(now time.Time) (bool, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sec := now.Truncate(time.Second); !sec.Equal(b.second) {
		b.second, b.n = sec, 0
	}
	if b.n >= refusalsPerSecond {
		b.skipped++
		return false, 0
	}
	b.n++
	skipped := b.skipped
	b.skipped = 0
	return true, skipped
}
