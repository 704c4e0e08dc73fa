package commitstatus

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Classify turns an unsuccessful HTTP answer into the error the Publisher acts upon:
// ErrUnauthorized for 401, a RetryableError for 5xx and for rate limits (429, or 403
// with Retry-After or an exhausted X-RateLimit-Remaining, which is how GitHub answers
// both its primary and secondary limits), and err itself otherwise. now is the time the
// answer arrived, to turn a reset time into a wait.
func Classify(resp *http.Response, err error, now time.Time) error {
	if resp == nil {
		return err
	}
	code := resp.StatusCode
	switch {
	case code == http.StatusUnauthorized:
		return fmt.Errorf("%w (HTTP %d)", ErrUnauthorized, code)
	case code >= 500:
		return Retryable(err, RetryAfter(resp.Header, now))
	case code == http.StatusTooManyRequests:
		// A rate limit however it is said: one that names no wait (a proxy in front of
		// the forge) still pauses the lanes a moment, and teaches the rate it refused.
		return Retryable(err, max(RetryAfter(resp.Header, now), unstatedRefusalWait))
	case code == http.StatusForbidden && (resp.Header.Get("Retry-After") != "" || resp.Header.Get("X-RateLimit-Remaining") == "0"):
		return Retryable(err, RetryAfter(resp.Header, now))
	}
	return err
}

// unstatedRefusalWait is how long every lane pauses after a 429 that names no wait.
const unstatedRefusalWait = time.Second

// RetryAfter reads how long a server asked to wait: Retry-After in seconds or as an
// HTTP date, else X-RateLimit-Reset (GitHub's and GitLab's epoch seconds, RateLimit-Reset
// on GitLab), else zero.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if v := h.Get("Retry-After"); v != "" {
		if s, err := strconv.Atoi(v); err == nil && s >= 0 {
			return time.Duration(s) * time.Second
		}
		if t, err := http.ParseTime(v); err == nil && t.After(now) {
			return t.Sub(now)
		}
	}
	for _, k := range []string{"X-RateLimit-Reset", "RateLimit-Reset"} {
		if v := h.Get(k); v != "" && h.Get(k[:len(k)-5]+"Remaining") == "0" {
			if s, err := strconv.ParseInt(v, 10, 64); err == nil {
				if t := time.Unix(s, 0); t.After(now) {
					return t.Sub(now)
				}
			}
		}
	}
	return 0
}
