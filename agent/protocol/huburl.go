package protocol

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// The hub's address is judged by one rule wherever it is written or read: by
// `flotilla fleet init` and the fleet model when fleet.yaml names it, and by the agent
// before it dials. A URL that one of them accepts and another refuses would let an
// engineer enroll a cluster whose agent can never connect.
//
// The rule:
//
//   - wss:// with a host, and an optional port from 1 to 65535. The tunnel carries the
//     agent's enrollment token, its credential and the worker's desired state.
//   - ws:// only to a loopback host (IsLoopbackHost), and only where an explicit switch
//     allows it: a hub and an agent on one machine, as in a demo. fleet.yaml may name
//     such a hub; the agent still needs its own switch to dial it.
//   - No user or password: agents authenticate with their enrollment token and
//     credential, and a secret in a URL ends up in logs and in Git.
//   - No query and no fragment: the agent appends the tunnel's Path to the URL, which
//     either would swallow.
//   - A path is kept as a prefix of Path, for a hub behind a proxy that routes by path;
//     a trailing slash is dropped.

// ErrInsecureLoopback is wrapped by the error of a ws:// URL to a loopback host when
// insecure loopback is not allowed: the one refusal that a switch of the caller's lifts.
var ErrInsecureLoopback = errors.New("insecure loopback not allowed")

// HubURLError says why a hub URL is refused.
type HubURLError struct {
	// URL is the refused URL as it may be shown, without its user information; empty
	// when the text does not parse as a URL, since it is then not known what in it is
	// secret.
	URL string
	// Reason completes a sentence about the URL: "must have no query or fragment".
	Reason string
	err    error
}

func (e *HubURLError) Error() string { return e.Message("hub URL") }

// Unwrap returns ErrInsecureLoopback when only the insecure-loopback switch is missing.
func (e *HubURLError) Unwrap() error { return e.err }

// Message is the refusal about the setting named subject, such as "spec.hubURL".
func (e *HubURLError) Message(subject string) string {
	if e.URL == "" {
		return subject + " " + e.Reason
	}
	return fmt.Sprintf("%s %q %s", subject, e.URL, e.Reason)
}

// CheckHubURL returns the hub's base URL, without a trailing slash, or a *HubURLError
// that says why raw is refused. allowInsecureLoopback admits ws:// to a loopback host.
func CheckHubURL(raw string, allowInsecureLoopback bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return nil, &HubURLError{Reason: "must be a wss:// URL with a host, such as wss://hub.example.com; this is not a URL"}
	}
	// The URL is shown as it was written, unless it holds a user or password.
	shown := raw
	if u.User != nil {
		withoutUser := *u
		withoutUser.User = nil
		shown = withoutUser.String()
	}
	refuse := func(format string, args ...any) (*url.URL, error) {
		return nil, &HubURLError{URL: shown, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case u.User != nil:
		return refuse("carries credentials; agents authenticate with their enrollment token and credential, never with a user or password in the URL")
	case u.Scheme == "":
		return refuse("must be a wss:// URL with a host; it has no scheme")
	case u.Scheme != "wss" && u.Scheme != "ws":
		return refuse("must be a wss:// URL with a host; %s:// is not accepted", u.Scheme)
	case u.Hostname() == "":
		return refuse("must be a wss:// URL with a host; it has none")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(raw, "#"):
		return refuse("must have no query or fragment")
	}
	if port := u.Port(); port != "" || strings.HasSuffix(u.Host, ":") {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return refuse("has port %q; a port is a number from 1 to 65535", port)
		}
	}
	if u.Scheme == "ws" {
		switch {
		case !IsLoopbackHost(u.Hostname()):
			return refuse("is unencrypted ws://; the hub must be wss:// (ws:// is allowed only to a loopback host)")
		case !allowInsecureLoopback:
			return nil, &HubURLError{URL: shown, err: ErrInsecureLoopback,
				Reason: "is unencrypted ws://; the hub must be wss://, unless insecure loopback is allowed for a hub on this machine"}
		}
	}
	base := *u
	base.Path = strings.TrimRight(u.Path, "/")
	base.RawPath = strings.TrimRight(u.RawPath, "/")
	return &base, nil
}

// IsLoopbackHost reports whether host, a name or an IP address without brackets or
// port (as url.URL.Hostname returns it), is this machine.
//
// An address is judged by netip: 127.0.0.0/8 and ::1, also as an IPv4-mapped IPv6
// address (::ffff:127.0.0.1). A zone does not change the address: ::1%lo is loopback,
// fe80::1%lo is not. Of names only "localhost" counts, in any case, and it is not
// resolved: the answer must not depend on a resolver, and judging a fleet repository
// makes no network request. Names under .localhost are not counted, because resolvers
// other than the system's may send them to DNS; nor are shorthand addresses such as
// 127.1, which some resolvers expand and others look up as names.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// IsLoopbackAddr is IsLoopbackHost for a "host:port" address, such as the remote
// address of an HTTP request.
func IsLoopbackAddr(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	return err == nil && IsLoopbackHost(host)
}
