package main

import (
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/agent/protocol/protocoltest"
)

// The agent dials every hub URL that `flotilla fleet init` writes, and refuses what
// fleet init refuses: both apply protocol.CheckHubURL, and the same examples pin both.
func TestAgentAcceptsTheHubURLsFleetInitWrites(t *testing.T) {
	for _, tc := range protocoltest.HubURLCases {
		t.Run(tc.Name, func(t *testing.T) {
			for _, allow := range []bool{false, true} {
				args := []string{"--hub-url", tc.URL, "--identity", "4-acme-gpu-a"}
				if allow {
					args = append(args, "--allow-insecure-loopback")
				}
				cfg, stdout, stderr, code := invoke(t, nil, args...)
				for _, secret := range protocoltest.Secrets {
					if strings.Contains(stdout+stderr, secret) {
						t.Errorf("output repeats a secret of the URL:\n%s%s", stdout, stderr)
					}
				}
				if !tc.Accepted(allow) {
					if code == 0 || !strings.Contains(stderr, tc.Refusal) {
						t.Errorf("--allow-insecure-loopback=%t: exit %d, stderr %q; want a refusal saying %q", allow, code, stderr, tc.Refusal)
					}
					if tc.Base != "" && !strings.Contains(stderr, "pass --allow-insecure-loopback") {
						t.Errorf("a loopback ws:// URL refused without naming the flag that allows it: %q", stderr)
					}
					continue
				}
				if code != 0 {
					t.Fatalf("--allow-insecure-loopback=%t: exit %d, stderr:\n%s", allow, code, stderr)
				}
				check(t, "HubURL", cfg.HubURL, tc.Base)
			}
		})
	}
}
