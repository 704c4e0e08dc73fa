package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/agent/protocol/protocoltest"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// fleet init writes only hub URLs that an agent dials (with --allow-insecure-loopback
// for a hub on its loopback), and the fleet model, which validates every head the hub
// reads, accepts and refuses the same URLs: all of them apply protocol.CheckHubURL, and
// the agent's tests run the same examples.
func TestFleetInitWritesOnlyHubURLsTheAgentDials(t *testing.T) {
	recipient := sopstest.Recipients(sopstest.NewIdentity(t))
	for _, tc := range protocoltest.HubURLCases {
		t.Run(tc.Name, func(t *testing.T) {
			accepted := tc.Accepted(true)
			dir := filepath.Join(t.TempDir(), "fleet")
			code, out, errOut := runCLI(t, "fleet", "init", dir, "--tenant", "acme", "--hub-url", tc.URL, "--age-recipient", recipient)
			for _, secret := range protocoltest.Secrets {
				if strings.Contains(out+errOut, secret) {
					t.Errorf("output repeats a secret of the URL:\n%s%s", out, errOut)
				}
			}
			if !accepted {
				if code != 1 || !strings.Contains(errOut, "--hub-url: hub URL") || !strings.Contains(errOut, tc.Refusal) {
					t.Errorf("fleet init: exit %d, stderr %q; want a refusal saying %q", code, errOut, tc.Refusal)
				}
				if _, err := os.Stat(dir); err == nil {
					t.Errorf("fleet init refused the URL and left %s behind", dir)
				}
			} else {
				if code != 0 {
					t.Fatalf("fleet init: exit %d, stderr:\n%s", code, errOut)
				}
				data, err := os.ReadFile(filepath.Join(dir, fleet.FleetFile))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(data), "hubURL: "+yamlScalar(tc.URL)+"\n") {
					t.Errorf("fleet.yaml does not name the hub as given:\n%s", data)
				}
				if note := "only when started with --allow-insecure-loopback"; strings.Contains(out, note) == tc.Secure {
					t.Errorf("fleet init output, with the URL secure=%t:\n%s", tc.Secure, out)
				}
			}

			fsys := fleetgen.Template()
			old := string(fsys[fleet.FleetFile].Data)
			edited := strings.Replace(old, "hubURL: wss://hub.example.com\n", "hubURL: "+yamlScalar(tc.URL)+"\n", 1)
			if edited == old && tc.URL != "wss://hub.example.com" {
				t.Fatal("the template's fleet.yaml no longer names wss://hub.example.com")
			}
			fsys[fleet.FleetFile] = &fstest.MapFile{Data: []byte(edited)}
			errs := fleet.Load(fsys).Errors
			if accepted {
				if len(errs) > 0 {
					t.Errorf("the fleet model refuses what fleet init writes:\n%s", errs.Error())
				}
				return
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Message, "spec.hubURL") || !strings.Contains(errs[0].Message, tc.Refusal) {
				t.Errorf("the fleet model's errors %q; want one on spec.hubURL saying %q", errs.Error(), tc.Refusal)
			}
		})
	}
}
