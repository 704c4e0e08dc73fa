package podrunner

import (
	"fmt"
	"strings"
	"testing"
)

// newTestRewriter plays the hub chart's container: its one volume at /etc/flotilla, its
// ports, and the Services of namespace flotilla-system.
func newTestRewriter() *rewriter {
	return &rewriter{
		mounts: []mount{{path: "/etc/flotilla/secrets", host: "/pods/p/volumes/secrets"}, {path: "/etc/flotilla", host: "/pods/p/volumes/config"}},
		ports:  map[int32]string{8443: "127.0.0.1:41001", 8080: "127.0.0.1:41002", 9443: "127.0.0.1:41003"},
		service: func(namespace, name string, port int32) (string, error) {
			if namespace != "flotilla-system" {
				return "", fmt.Errorf("no service %s/%s", namespace, name)
			}
			return fmt.Sprintf("127.0.0.1:5%04d", port), nil
		},
	}
}

func TestWhatAContainerNamesOfItsPodIsRewrittenForThisMachine(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"a file under a mount", "/etc/flotilla/config.yaml", "/pods/p/volumes/config/config.yaml"},
		{"the mount itself", "/etc/flotilla", "/pods/p/volumes/config"},
		{"the innermost mount wins", "/etc/flotilla/secrets/tls/tls.crt", "/pods/p/volumes/secrets/tls/tls.crt"},
		{"a path that only shares a prefix", "/etc/flotillax/config.yaml", "/etc/flotillax/config.yaml"},
		{"a listen address of a container port", ":8443", "127.0.0.1:41001"},
		{"every interface", "0.0.0.0:8080", "127.0.0.1:41002"},
		{"IPv6's every interface", "[::]:9443", "127.0.0.1:41003"},
		{"a port the container does not declare", ":9090", ":9090"},
		{"a specific address", "10.0.0.1:8443", "10.0.0.1:8443"},
		{"a Service's cluster name with its port", "https://flotilla-hub-proxy.flotilla-system.svc:9443", "https://127.0.0.1:59443"},
		{"the fully qualified name and a path", "http://flotilla-hub-http.flotilla-system.svc.cluster.local/webhooks/acme", "http://127.0.0.1:50080/webhooks/acme"},
		{"the scheme's port", "wss://flotilla-hub-tunnel.flotilla-system.svc", "wss://127.0.0.1:50443"},
		{"a host outside the cluster", "https://git.example.com/acme/fleet.git", "https://git.example.com/acme/fleet.git"},
		{"plain text", "acme", "acme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := newTestRewriter().str(tc.in); got != tc.want {
				t.Fatalf("%q became %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestAConfigurationFileKeepsItsKeysAndRewritesItsValues(t *testing.T) {
	in := `listen:
  tunnel: ":8443"
  http: :8080
tls:
  certFile: /etc/flotilla/secrets/tls/tls.crt
dispatch:
  url: https://flotilla-hub-proxy.flotilla-system.svc:9443
  resumeWindow: 60s
# A key that looks like a path stays a key.
/etc/flotilla: kept
replicas: 8443
`
	w := newTestRewriter()
	out, changed, err := w.yaml([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !changed {
		t.Fatal("nothing was rewritten")
	}
	for _, want := range []string{`tunnel: "127.0.0.1:41001"`, "http: 127.0.0.1:41002", "certFile: /pods/p/volumes/secrets/tls/tls.crt",
		"url: https://127.0.0.1:59443", "resumeWindow: 60s", "/etc/flotilla: kept", "replicas: 8443", "# A key that looks like a path"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the rewritten file lacks %q:\n%s", want, out)
		}
	}
	for _, notYAML := range []string{"flt1_abcdef\n", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"} {
		if _, changed, err := w.yaml([]byte(notYAML)); err != nil || changed {
			t.Errorf("%q, which is no configuration, was rewritten (%v)", notYAML, err)
		}
	}
}

func TestContainerFieldsResolveAsTheKubeletResolvesThem(t *testing.T) {
	env := []envVar{{"POD_NAME", "hub-0"}, {"PORT", "8080"}}
	for _, tc := range []struct{ in, want string }{
		{"--name=$(POD_NAME)", "--name=hub-0"},
		{"$(POD_NAME):$(PORT)", "hub-0:8080"},
		{"$$(POD_NAME)", "$(POD_NAME)"},
		{"$(UNKNOWN)", "$(UNKNOWN)"},
		{"cost: $5", "cost: $5"},
	} {
		if got := expandVars(tc.in, env); got != tc.want {
			t.Errorf("expandVars(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	for in, want := range map[string]string{
		"registry.acme.example/flotilla-hub:0.1.0":        "registry.acme.example/flotilla-hub",
		"registry.acme.example:5000/flotilla-hub":         "registry.acme.example:5000/flotilla-hub",
		"registry.acme.example:5000/flotilla-hub:v1":      "registry.acme.example:5000/flotilla-hub",
		"ghcr.io/flotilla-gitops/flotilla-agent@sha256:0": "ghcr.io/flotilla-gitops/flotilla-agent",
		"flotilla-hub": "flotilla-hub",
	} {
		if got := imageRepository(in); got != want {
			t.Errorf("imageRepository(%q) = %q, want %q", in, got, want)
		}
	}
}
