package components_test

import (
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

var (
	digestA = "sha256:" + strings.Repeat("a1", 32)
	digestB = "sha256:" + strings.Repeat("b2", 32)
)

func release(registry string) components.Spec {
	return components.Spec{Managed: true, Registry: registry,
		Kueue: components.Release{Version: "v0.17.0"}, JobSet: components.Release{Version: "v0.11.1"}}
}

// Which registries an entry of components.allowedRegistries lets the images come from:
// the host and port exactly, the host in any case, the path as a prefix on a "/".
func TestAnAllowedRegistryMatchesItsHostAndPortExactlyAndItsPathOnASegment(t *testing.T) {
	tests := []struct {
		name     string
		allowed  []string
		registry string // spec.components.registry; "" is registry.k8s.io
		ok       bool
	}{
		{"registry.k8s.io by default", nil, "", true},
		{"registry.k8s.io named", nil, "registry.k8s.io", true},
		{"a mirror is not allowed by default", nil, "mirror.example.com", false},
		{"the mirror listed", []string{"mirror.example.com"}, "mirror.example.com", true},
		{"listing a mirror drops the default", []string{"mirror.example.com"}, "", false},
		{"a path under the listed one", []string{"mirror.example.com/k8s"}, "mirror.example.com/k8s/staging", true},
		{"the listed path itself", []string{"mirror.example.com/k8s"}, "mirror.example.com/k8s", true},
		{"a trailing slash in the state", []string{"mirror.example.com/k8s"}, "mirror.example.com/k8s/", true},
		{"a trailing slash in the entry", []string{"mirror.example.com/k8s/"}, "mirror.example.com/k8s", true},
		{"a path sharing the prefix but not the segment", []string{"mirror.example.com/k8s"}, "mirror.example.com/k8s-old", false},
		{"the host without the listed path", []string{"mirror.example.com/k8s"}, "mirror.example.com", false},
		{"the host's case does not matter", []string{"Mirror.Example.COM"}, "mirror.example.com", true},
		{"nor the state's", []string{"mirror.example.com"}, "MIRROR.example.com", true},
		{"another port", []string{"mirror.example.com:5000"}, "mirror.example.com:5001", false},
		{"no port where one is listed", []string{"mirror.example.com:5000"}, "mirror.example.com", false},
		{"a port where none is listed", []string{"mirror.example.com"}, "mirror.example.com:5000", false},
		{"the listed port", []string{"mirror.example.com:5000"}, "mirror.example.com:5000/k8s", true},
		{"the default port is a port too", []string{"registry.k8s.io"}, "registry.k8s.io:443", false},
		{"a host that only starts like the listed one", []string{"mirror.example.com"}, "mirror.example.com.attacker.net", false},
		{"a subdomain of the listed one", []string{"example.com"}, "mirror.example.com", false},
		{"an address", []string{"10.0.0.5:5000"}, "10.0.0.5:5000", true},
		{"an IPv6 address", []string{"[fd00::5]:5000"}, "[FD00::5]:5000/k8s", true},
		{"one of several", []string{"registry.k8s.io", "mirror.example.com"}, "mirror.example.com", true},
		// The entry is matched against each image: kueue/kueue lies under
		// registry.k8s.io/kueue, jobset/jobset does not, and the state installs nothing.
		{"an entry that covers one image only", []string{"registry.k8s.io/kueue"}, "", false},
		{"a state's registry that is not one", nil, "https://registry.k8s.io", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := components.ImagePolicy{AllowedRegistries: tt.allowed}
			refused := p.Refused(release(tt.registry))
			if (refused == nil) != tt.ok {
				t.Fatalf("registries %v, state's registry %q: refused %+v, want allowed=%v", tt.allowed, tt.registry, refused, tt.ok)
			}
			for _, s := range refused {
				if s.Action != components.ActionRefused || s.Reason != components.ReasonRegistryNotAllowed || s.Ready {
					t.Errorf("%s: %+v, want refused, not ready, for its registry", s.Component, s)
				}
			}
		})
	}
}

// What a refusal says: which registry, the value that allows it and who sets it; or which
// image lacks which digest.
func TestARefusalSaysWhatWasRefusedAndHowTheWorkersAdministratorAllowsIt(t *testing.T) {
	withDigest := func(s components.Spec, kueue, jobset string) components.Spec {
		s.Kueue.Digest, s.JobSet.Digest = kueue, jobset
		return s
	}
	tests := []struct {
		name   string
		policy components.ImagePolicy
		spec   components.Spec
		reason string // "" for allowed
		msg    string
	}{
		{
			name:   "a registry not listed",
			spec:   release("mirror.example"),
			reason: components.ReasonRegistryNotAllowed,
			msg:    `registry "mirror.example" is not among the registries this worker allows (components.allowedRegistries in the agent's Helm values: registry.k8s.io); its administrator adds it there`,
		},
		{
			name:   "the list is named as normalized",
			policy: components.ImagePolicy{AllowedRegistries: []string{"Registry.K8s.io", "mirror.example.com/k8s/"}},
			spec:   release("other.example:5000/k8s"),
			reason: components.ReasonRegistryNotAllowed,
			msg:    `registry "other.example:5000/k8s" is not among the registries this worker allows (components.allowedRegistries in the agent's Helm values: registry.k8s.io, mirror.example.com/k8s); its administrator adds it there`,
		},
		{
			name:   "a registry that is not one",
			spec:   release("https://mirror.example"),
			reason: components.ReasonRegistryNotAllowed,
			msg:    `registry "https://mirror.example" is not a registry name: must be a registry host and optional path, without a scheme`,
		},
		{
			name:   "a required digest missing",
			policy: components.ImagePolicy{RequiredDigests: map[string]string{"kueue/kueue:v0.17.0": digestA}},
			spec:   release(""),
			reason: components.ReasonDigestNotAllowed,
			msg:    "kueue's image registry.k8s.io/kueue/kueue:v0.17.0 carries no digest, and this worker requires " + digestA + " for kueue/kueue:v0.17.0 (components.requiredDigests in the agent's Helm values); the fleet pins it with spec.components.kueueDigest in fleet.yaml",
		},
		{
			name:   "another digest",
			policy: components.ImagePolicy{RequiredDigests: map[string]string{"jobset/jobset:v0.11.1": digestA}},
			spec:   withDigest(release(""), "", digestB),
			reason: components.ReasonDigestNotAllowed,
			msg:    "jobset's image registry.k8s.io/jobset/jobset:v0.11.1@" + digestB + " is not the one this worker allows: it requires " + digestA + " for jobset/jobset:v0.11.1",
		},
		{
			name:   "the required digest, from a mirror",
			policy: components.ImagePolicy{AllowedRegistries: []string{"mirror.example.com"}, RequiredDigests: map[string]string{"kueue/kueue:v0.17.0": digestA}},
			spec:   withDigest(release("mirror.example.com"), digestA, ""),
		},
		{
			name:   "a digest required of another version only",
			policy: components.ImagePolicy{RequiredDigests: map[string]string{"kueue/kueue:v0.16.0": digestA}},
			spec:   release(""),
		},
		{
			name:   "a registry and a digest: the registry's reason, both problems",
			policy: components.ImagePolicy{RequiredDigests: map[string]string{"kueue/kueue:v0.17.0": digestA}},
			spec:   release("mirror.example"),
			reason: components.ReasonRegistryNotAllowed,
			msg:    `registry "mirror.example" is not among the registries this worker allows (components.allowedRegistries in the agent's Helm values: registry.k8s.io); its administrator adds it there; kueue's image mirror.example/kueue/kueue:v0.17.0 carries no digest`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refused := tt.policy.Refused(tt.spec)
			if tt.reason == "" {
				if refused != nil {
					t.Fatalf("refused: %+v", refused)
				}
				return
			}
			if len(refused) != len(components.All()) {
				t.Fatalf("refused %+v, want every component", refused)
			}
			// The whole state installs nothing: every component says why, in the same words.
			for i, s := range refused {
				c := components.All()[i]
				if s.Component != c || s.Version != tt.spec.Release(c).Version || s.Action != components.ActionRefused || s.Ready || s.Reason != tt.reason {
					t.Errorf("status %+v, want %s %s refused for %s", s, c, tt.spec.Release(c).Version, tt.reason)
				}
				if !strings.HasPrefix(s.Message, tt.msg) {
					t.Errorf("%s's message:\n%s\nwant it to start with\n%s", c, s.Message, tt.msg)
				}
			}
		})
	}
}

func TestParseRegistryNormalizesTheHostAndRefusesWhatIsNotARegistry(t *testing.T) {
	tests := []struct {
		in, want string // want "" for an error
		problem  string
	}{
		{in: "registry.k8s.io", want: "registry.k8s.io"},
		{in: "Mirror.Example.COM:5000/k8s/", want: "mirror.example.com:5000/k8s"},
		{in: "10.0.0.5:5000", want: "10.0.0.5:5000"},
		{in: "[FD00::5]:5000", want: "[fd00::5]:5000"},
		{in: "[fd00::5]", want: "[fd00::5]"},
		{in: "localhost/a.b/c__d/e-f", want: "localhost/a.b/c__d/e-f"},
		{in: "https://mirror.example.com", problem: "without a scheme"},
		{in: "*.example.com", problem: "wildcard"},
		{in: "mirror.example.com/*", problem: "wildcard"},
		{in: "mirror_host", problem: "must start with a registry host"},
		{in: "", problem: "must start with a registry host"},
		{in: "/k8s", problem: "must start with a registry host"},
		{in: "mirror.example.com:0", problem: `invalid port "0"`},
		{in: "mirror.example.com:99999", problem: `invalid port "99999"`},
		{in: "mirror.example.com/K8s", problem: `invalid path component "K8s"`},
		{in: "mirror.example.com/k8s:latest", problem: `invalid path component "k8s:latest"`},
		{in: "mirror.example.com//k8s", problem: `invalid path component ""`},
		{in: "mirror.example.com/" + strings.Repeat("a", 200), problem: "longer than 200"},
	}
	for _, tt := range tests {
		got, err := components.ParseRegistry(tt.in)
		switch {
		case tt.want != "" && (err != nil || got != tt.want):
			t.Errorf("ParseRegistry(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		case tt.want == "" && (err == nil || !strings.Contains(err.Error(), tt.problem)):
			t.Errorf("ParseRegistry(%q) = %q, %v; want an error saying %q", tt.in, got, err, tt.problem)
		}
	}
}

func TestARequiredDigestNamesAnImageTheInstallerRuns(t *testing.T) {
	tests := []struct {
		key, digest string
		problem     string // "" for valid
	}{
		{key: "kueue/kueue:v0.17.0", digest: digestA},
		{key: "jobset/jobset:v0.12.0-rc.1", digest: digestB},
		{key: "kueue:v0.17.0", digest: digestA, problem: `key "kueue:v0.17.0" names no image the installer runs; it runs jobset/jobset:<tag> and kueue/kueue:<tag>`},
		{key: "registry.k8s.io/kueue/kueue:v0.17.0", digest: digestA, problem: "names no image the installer runs"},
		{key: "kueue/kueue", digest: digestA, problem: "is not a repository path and tag such as kueue/kueue:v0.17.0"},
		{key: "kueue/kueue:", digest: digestA, problem: "is not a repository path and tag"},
		{key: "kueue/kueue:v0.17.0", digest: "sha256:ABC", problem: `the digest of kueue/kueue:v0.17.0 is "sha256:ABC", not sha256:<64 hex digits>`},
		{key: "kueue/kueue:v0.17.0", digest: strings.TrimPrefix(digestA, "sha256:"), problem: "not sha256:<64 hex digits>"},
	}
	for _, tt := range tests {
		err := components.CheckRequiredDigest(tt.key, tt.digest)
		switch {
		case tt.problem == "" && err != nil:
			t.Errorf("CheckRequiredDigest(%q, %q) = %v", tt.key, tt.digest, err)
		case tt.problem != "" && (err == nil || !strings.Contains(err.Error(), tt.problem)):
			t.Errorf("CheckRequiredDigest(%q, %q) = %v; want an error saying %q", tt.key, tt.digest, err, tt.problem)
		}
	}
}
