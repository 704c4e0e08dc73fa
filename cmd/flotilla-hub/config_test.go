package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const goodConfig = `listen:
  tunnel: 127.0.0.1:0
allowInsecureLoopback: true
age:
  identityFiles: [/etc/flotilla/age.key]
sources:
- name: acme
  url: https://git.example/acme/fleet.git
  tenant: acme
  webhookSecretFile: /etc/flotilla/webhook
  statuses:
    kind: github
    owner: acme
    repo: fleet
    tokenFile: /etc/flotilla/github-token
`

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hub.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfig(t *testing.T) {
	c, err := LoadConfig(writeConfig(t, goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Sources[0]
	if s.Branch != "main" || s.Namespace != "acme" || time.Duration(s.Poll) != time.Minute || c.Listen.HTTP != ":8080" || c.LeaderElection.Name != "flotilla-hub" {
		t.Fatalf("defaults not applied: %+v", c)
	}
	// Thousands of agents each cost the hub cluster a few requests when they connect.
	if c.KubeAPI.QPS != 100 || c.KubeAPI.Burst != 200 || c.KubeAPI.MaxInFlight != 64 {
		t.Fatalf("kubeAPI = %+v, want 100 requests per second in bursts of 200, 64 at most in flight", c.KubeAPI)
	}
	rc, err := restConfig(&Config{Kubeconfig: writeKubeconfig(t), KubeAPI: c.KubeAPI})
	if err != nil || rc.QPS != 100 || rc.Burst != 200 {
		t.Fatalf("the hub's client is limited to %v/s in bursts of %d (%v)", rc.QPS, rc.Burst, err)
	}
}

// Which hub namespaces each tenant queues in is said per source; two sources claim
// none of the same.
func TestLoadConfigGivesEachSourceItsHubNamespaces(t *testing.T) {
	c, err := LoadConfig(writeConfig(t, goodConfig+"  dispatch:\n    workloadNamespaces: [ml, ml-batch]\n"+
		"- name: beta\n  url: https://git.example/beta.git\n  tenant: beta\n  dispatch:\n    workloadNamespaces: [ml-beta]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Sources[0].Dispatch.WorkloadNamespaces; !slices.Equal(got, []string{"ml", "ml-batch"}) {
		t.Errorf("acme's hub namespaces %v", got)
	}
	if got := c.Sources[1].Dispatch.WorkloadNamespaces; !slices.Equal(got, []string{"ml-beta"}) {
		t.Errorf("beta's hub namespaces %v", got)
	}
}

func writeKubeconfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	const kubeconfig = "apiVersion: v1\nkind: Config\nclusters: [{name: hub, cluster: {server: \"https://127.0.0.1:6443\"}}]\n" +
		"users: [{name: hub, user: {}}]\ncontexts: [{name: hub, context: {cluster: hub, user: hub}}]\ncurrent-context: hub\n"
	if err := os.WriteFile(p, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfigRefuses(t *testing.T) {
	tests := []struct {
		name string
		edit func(string) string
		want string
	}{
		{"an unknown field, with its line", func(s string) string { return s + "colour: blue\n" }, "line 16: field colour not found"},
		{"a tunnel without TLS off loopback", func(s string) string { return strings.Replace(s, "allowInsecureLoopback: true\n", "", 1) }, "certificate"},
		{"credentials in the repository URL", func(s string) string {
			return strings.Replace(s, "https://git.example", "https://bot:hunter2@git.example", 1)
		}, "credentials in the URL"},
		{"two sources writing one namespace", func(s string) string {
			return s + "- name: other\n  url: https://git.example/other.git\n  tenant: other\n  namespace: acme\n"
		}, "written by another source"},
		{"an unknown status kind", func(s string) string { return strings.Replace(s, "kind: github", "kind: bitbucket", 1) }, "bitbucket"},
		{"no age identity", func(s string) string { return strings.Replace(s, "  identityFiles: [/etc/flotilla/age.key]\n", "", 1) }, "age identity"},
		{"a malformed duration", func(s string) string { return s + "heartbeat:\n  interval: often\n" }, "not a duration"},
		{"a negative request rate", func(s string) string { return s + "kubeAPI:\n  qps: -1\n" }, "must not be negative"},
		{"a negative plan deadline", func(s string) string { return s + "plans:\n  timeout: -1s\n" }, "plans: timeout"},
		{"a negative fetch deadline", func(s string) string { return s + "heads:\n  fetch:\n    timeout: -1s\n" }, "heads: fetch: timeout"},
		{"a negative cluster budget", func(s string) string { return s + "heads:\n  maxClusterBytes: -1\n" }, "maxClusterBytes"},
		{"two sources of one tenant, naming both", func(s string) string {
			return s + "- name: other\n  url: https://git.example/other.git\n  tenant: acme\n  namespace: other\n"
		}, "sources acme and other both follow tenant acme"},
		{"profiles on every interface", func(s string) string { return s + "pprof:\n  listen: :6060\n" }, "pprof.listen: \":6060\" is not a loopback address"},
		{"profiles on a pod's address", func(s string) string { return s + "pprof:\n  listen: 10.0.0.7:6060\n" }, "not a loopback address"},
		{"a tenant with a dot", func(s string) string { return strings.Replace(s, "tenant: acme", "tenant: acme.us", 1) }, `"acme.us" is not a DNS label`},
		{"a tenant in capitals", func(s string) string { return strings.Replace(s, "tenant: acme", "tenant: Acme", 1) }, `"Acme" is not a DNS label`},
		{"one hub namespace claimed by two sources, naming both", func(s string) string {
			return s + "  dispatch:\n    workloadNamespaces: [ml]\n- name: beta\n  url: https://git.example/beta.git\n  tenant: beta\n  dispatch:\n    workloadNamespaces: [ml]\n"
		}, "sources acme and beta both claim hub namespace ml"},
		{"a hub namespace of Kubernetes", func(s string) string { return s + "  dispatch:\n    workloadNamespaces: [kube-public]\n" }, "kube-public is Kubernetes' own"},
		{"Kueue's namespace", func(s string) string { return s + "  dispatch:\n    workloadNamespaces: [kueue-system]\n" }, "kueue-system is Kueue's own"},
		{"the hub's namespace", func(s string) string {
			return s + "  dispatch:\n    workloadNamespaces: [flotilla-system]\nleaderElection:\n  enabled: true\n  namespace: flotilla-system\n"
		}, "flotilla-system is the hub's own"},
		{"a source's namespace", func(s string) string { return s + "  dispatch:\n    workloadNamespaces: [acme]\n" }, "acme is a source's namespace"},
		{"a hub namespace that is no namespace's name", func(s string) string { return s + "  dispatch:\n    workloadNamespaces: [ML]\n" }, `"ML" is not a namespace's name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeConfig(t, tt.edit(goodConfig))
			_, err := LoadConfig(p)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("LoadConfig = %v, want an error naming the file and saying %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatal("the error shows the password")
			}
		})
	}
}

// Go's profiles are off by default, served on loopback when asked, and beyond it only
// when the configuration says so in as many words.
func TestProfilesAreServedOnLoopbackUnlessAllowedBeyond(t *testing.T) {
	for _, tc := range []struct {
		name, add string
		want      string
	}{
		{"off by default", "", ""},
		{"loopback", "pprof:\n  listen: 127.0.0.1:6060\n", "127.0.0.1:6060"},
		{"localhost", "pprof:\n  listen: localhost:6060\n", "localhost:6060"},
		{"IPv6 loopback", "pprof:\n  listen: \"[::1]:6060\"\n", "[::1]:6060"},
		{"every interface, allowed", "pprof:\n  listen: :6060\n  allowRemote: true\n", ":6060"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := LoadConfig(writeConfig(t, goodConfig+tc.add))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Pprof.Listen != tc.want {
				t.Fatalf("pprof.listen %q, want %q", cfg.Pprof.Listen, tc.want)
			}
		})
	}
}

// The profiles' listener serves what an operator asks of a hub in the field.
func TestTheProfilesListenerServesGoroutinesAndHeap(t *testing.T) {
	srv := httptest.NewServer(pprofMux())
	t.Cleanup(srv.Close)
	for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/goroutine?debug=1": "goroutine profile:", "/debug/pprof/heap?debug=1": "heap profile:"} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %d, %.200s; want 200 with %q", path, resp.StatusCode, body, want)
		}
	}
}
