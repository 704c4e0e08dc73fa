package protocol_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/agent/protocol/protocoltest"
)

func TestCheckHubURLAcceptsWSSAndLoopbackWSOnlyWhenAllowed(t *testing.T) {
	for _, tc := range protocoltest.HubURLCases {
		t.Run(tc.Name, func(t *testing.T) {
			for _, allow := range []bool{false, true} {
				u, err := protocol.CheckHubURL(tc.URL, allow)
				if !tc.Accepted(allow) {
					if err == nil {
						t.Fatalf("allowInsecureLoopback=%t: accepted as %s", allow, u)
					}
					if !strings.Contains(err.Error(), tc.Refusal) {
						t.Errorf("allowInsecureLoopback=%t: %q does not say %q", allow, err, tc.Refusal)
					}
					for _, secret := range protocoltest.Secrets {
						if strings.Contains(err.Error(), secret) {
							t.Errorf("the refusal repeats the URL's credentials: %q", err)
						}
					}
					var hue *protocol.HubURLError
					if !errors.As(err, &hue) {
						t.Errorf("%T is not a *HubURLError", err)
					}
					// Only the switch's refusal is lifted by the switch.
					if onlySwitch := tc.Base != ""; errors.Is(err, protocol.ErrInsecureLoopback) != onlySwitch {
						t.Errorf("errors.Is(ErrInsecureLoopback) = %t, want %t", !onlySwitch, onlySwitch)
					}
					continue
				}
				if err != nil {
					t.Fatalf("allowInsecureLoopback=%t: refused: %v", allow, err)
				}
				if u.String() != tc.Base {
					t.Errorf("allowInsecureLoopback=%t: base %s, want %s", allow, u, tc.Base)
				}
			}
		})
	}
}

func TestHubURLErrorNamesTheSetting(t *testing.T) {
	_, err := protocol.CheckHubURL("https://hub.example.com", true)
	var hue *protocol.HubURLError
	if !errors.As(err, &hue) {
		t.Fatalf("%v is not a *HubURLError", err)
	}
	if got, want := hue.Message("spec.hubURL"), `spec.hubURL "https://hub.example.com" must be a wss:// URL with a host; https:// is not accepted`; got != want {
		t.Errorf("Message = %q, want %q", got, want)
	}
	_, err = protocol.CheckHubURL("wss://u:p w@hub", true)
	if !errors.As(err, &hue) || hue.URL != "" || strings.Contains(err.Error(), "p w") {
		t.Errorf("a URL that does not parse: %#v; want it not repeated", err)
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.255.255.254", true},
		{"128.0.0.1", false},
		{"::1", true},
		{"0:0:0:0:0:0:0:1", true},
		{"::ffff:127.0.0.1", true}, // IPv4-mapped: the same address
		{"::ffff:10.0.0.1", false},
		{"::1%lo", true},      // a zone does not change the address
		{"fe80::1%lo", false}, // link-local, whatever the interface
		{"localhost", true},
		{"LOCALHOST", true},
		{"localhost.", false},    // names are matched, never resolved
		{"hub.localhost", false}, // resolvers may send it to DNS
		{"localhost.example", false},
		{"127.1", false}, // shorthand some resolvers expand and others look up
		{"0127.0.0.1", false},
		{"0.0.0.0", false},
		{"::", false},
		{"[::1]", false}, // brackets belong to a URL, not to a host
		{"", false},
		{"hub.example.com", false},
	} {
		if got := protocol.IsLoopbackHost(tc.host); got != tc.want {
			t.Errorf("IsLoopbackHost(%q) = %t, want %t", tc.host, got, tc.want)
		}
	}
}

func TestIsLoopbackAddrJudgesTheHostOfARemoteAddress(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:51234", true},
		{"[::1]:51234", true},
		{"[::ffff:127.0.0.1]:51234", true},
		{"10.0.0.7:51234", false},
		{"[2001:db8::1]:51234", false},
		{"127.0.0.1", false}, // not host:port
		{"", false},
	} {
		if got := protocol.IsLoopbackAddr(tc.addr); got != tc.want {
			t.Errorf("IsLoopbackAddr(%q) = %t, want %t", tc.addr, got, tc.want)
		}
	}
}
