// Package protocoltest holds the examples that pin the rules of package protocol, for
// the tests of protocol itself and of every program that applies those rules through
// its own flags or files.
package protocoltest

// HubURLCase is one example of the hub-URL rule (protocol.CheckHubURL).
type HubURLCase struct {
	Name string
	URL  string
	// Base is the accepted URL when insecure loopback is allowed; empty when the URL is
	// refused even then.
	Base string
	// Secure tells that the URL is accepted without insecure loopback too.
	Secure bool
	// Refusal is part of the error when the URL is refused.
	Refusal string
}

// Accepted tells whether the rule accepts the URL with or without insecure loopback.
func (c HubURLCase) Accepted(allowInsecureLoopback bool) bool {
	return c.Base != "" && (c.Secure || allowInsecureLoopback)
}

// HubURLCases are URLs that `flotilla fleet init`, the fleet model and the agent all
// accept, or all refuse. The rows with a secret in them repeat it in no refusal.
var HubURLCases = []HubURLCase{
	{Name: "wss with a host", URL: "wss://hub.example.com", Base: "wss://hub.example.com", Secure: true},
	{Name: "wss with a port", URL: "wss://hub.example.com:8443", Base: "wss://hub.example.com:8443", Secure: true},
	{Name: "wss with a trailing slash, dropped", URL: "wss://hub.example.com/", Base: "wss://hub.example.com", Secure: true},
	{Name: "wss with a path prefix for a proxy", URL: "wss://gw.example.com/flotilla/", Base: "wss://gw.example.com/flotilla", Secure: true},
	{Name: "the scheme in capitals", URL: "WSS://hub.example.com", Base: "wss://hub.example.com", Secure: true},
	{Name: "wss to an IPv6 address", URL: "wss://[2001:db8::1]:8443", Base: "wss://[2001:db8::1]:8443", Secure: true},
	{Name: "ws to 127.0.0.1", URL: "ws://127.0.0.1:9443", Base: "ws://127.0.0.1:9443", Refusal: "unless insecure loopback is allowed"},
	{Name: "ws to another address of 127/8", URL: "ws://127.1.2.3:9443", Base: "ws://127.1.2.3:9443", Refusal: "unless insecure loopback is allowed"},
	{Name: "ws to ::1", URL: "ws://[::1]:9443", Base: "ws://[::1]:9443", Refusal: "unless insecure loopback is allowed"},
	{Name: "ws to localhost in any case", URL: "ws://LocalHost:9443", Base: "ws://LocalHost:9443", Refusal: "unless insecure loopback is allowed"},
	{Name: "ws to a remote host", URL: "ws://hub.example.com", Refusal: "allowed only to a loopback host"},
	{Name: "ws to a name under localhost", URL: "ws://hub.localhost:9443", Refusal: "allowed only to a loopback host"},
	{Name: "ws to the unspecified address", URL: "ws://0.0.0.0:9443", Refusal: "allowed only to a loopback host"},
	{Name: "https", URL: "https://hub.example.com", Refusal: `"https://hub.example.com" must be a wss:// URL with a host; https:// is not accepted`},
	{Name: "http to loopback", URL: "http://127.0.0.1:9443", Refusal: "http:// is not accepted"},
	{Name: "no scheme", URL: "hub.example.com", Refusal: "it has no scheme"},
	{Name: "a host and port without scheme", URL: "hub.example.com:8443", Refusal: "this is not a URL"},
	{Name: "no host", URL: "wss://", Refusal: `"wss://" must be a wss:// URL with a host; it has none`},
	{Name: "only a port", URL: "wss://:8443", Refusal: "it has none"},
	{Name: "not a URL", URL: "wss://hub example:port", Refusal: "must be a wss:// URL with a host"},
	{Name: "user and password", URL: "wss://user:pa55word@hub.example.com", Refusal: `"wss://hub.example.com" carries credentials`},
	{Name: "a user alone", URL: "wss://flt1_token@hub.example.com", Refusal: "carries credentials"},
	{Name: "a query", URL: "wss://hub.example.com/?x=1", Refusal: "must have no query or fragment"},
	{Name: "an empty query", URL: "wss://hub.example.com?", Refusal: "must have no query or fragment"},
	{Name: "a fragment", URL: "wss://hub.example.com#tunnel", Refusal: "must have no query or fragment"},
	{Name: "an empty fragment", URL: "wss://hub.example.com#", Refusal: "must have no query or fragment"},
	{Name: "port 0", URL: "wss://hub.example.com:0", Refusal: `has port "0"`},
	{Name: "a port too large", URL: "wss://hub.example.com:65536", Refusal: `has port "65536"`},
	{Name: "an empty port", URL: "wss://hub.example.com:", Refusal: `has port ""`},
}

// Secrets are the credentials in HubURLCases, which no refusal may repeat.
var Secrets = []string{"pa55word", "flt1_token"}
