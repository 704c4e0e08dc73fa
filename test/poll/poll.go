// Package poll waits in tests for what a real system does in its own time: a condition
// is checked again and again until it holds or a generous deadline passes, so that a
// test never sleeps in place of readiness and never asserts on wall-clock time.
package poll

import (
	"testing"
	"time"
)

// Deadline is how long Until waits: generous, because a loaded two-core machine runs
// several control planes at once; a passing test waits only as long as it must.
const Deadline = 45 * time.Second

// interval between checks.
const interval = 20 * time.Millisecond

// Until checks cond until it holds, and fails the test with what and cond's last word
// on why not once Deadline has passed.
func Until(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	Within(t, Deadline, what, cond)
}

// Receive is what ch sends, once it does, and fails the test with what once Deadline
// has passed: for a call that must return in time, run in a goroutine that sends its
// result.
func Receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	var v T
	Until(t, what, func() (bool, string) {
		select {
		case v = <-ch:
			return true, ""
		default:
			return false, "it has not returned"
		}
	})
	return v
}

// Within is Until with a deadline of its own, for what the system under test takes
// longer than Deadline to do by design, such as a backoff that doubles.
func Within(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		time.Sleep(interval)
	}
	t.Fatalf("%s: not reached in time; last: %s", what, last)
}
