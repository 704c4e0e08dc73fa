package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/reconciler/leader"
	"github.com/flotilla-gitops/flotilla/test/helmtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

var updateGolden = flag.Bool("update", false, "rewrite the chart's golden renders in testdata/chart/")

const (
	hubChart   = "../../charts/flotilla-hub"
	agentChart = "../../charts/flotilla-agent"
	// The release as the chart's README installs it.
	hubRelease   = "flotilla-hub"
	hubNamespace = "flotilla-system"
)

// ciCase is one example values file of a chart (ci/*-values.yaml, chart-testing's
// convention): ci/forges-values.yaml is case forges.
type ciCase struct {
	name   string
	values map[string]any
}

// ciValues are a chart's example values, by name.
func ciValues(t *testing.T, chart string) []ciCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chart, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("%s has no ci/*-values.yaml", chart)
	}
	var out []ciCase
	for _, f := range files { // sorted by Glob
		out = append(out, ciCase{strings.TrimSuffix(filepath.Base(f), "-values.yaml"), helmtest.ValuesFile(t, f)})
	}
	return out
}

// ciValuesOf is one of the chart's example values.
func ciValuesOf(t *testing.T, name string) map[string]any {
	t.Helper()
	return helmtest.ValuesFile(t, filepath.Join(hubChart, "ci", name+"-values.yaml"))
}

func renderHub(t *testing.T, values map[string]any) helmtest.Objects {
	t.Helper()
	return helmtest.MustRender(t, hubChart, helmtest.Options{Release: hubRelease, Namespace: hubNamespace, Values: values})
}

// minimalValues are ci/minimal-values.yaml, a fresh copy, for a test to change.
func minimalValues(t *testing.T) map[string]any {
	t.Helper()
	return ciValuesOf(t, "minimal")
}

// one returns the single object of a kind and name, typed.
func one[T any](t *testing.T, objs helmtest.Objects, kind, name string) *T {
	t.Helper()
	u := objs.Find(kind, name)
	if u == nil {
		t.Fatalf("the chart renders no %s %s", kind, name)
	}
	return helmtest.Typed[T](t, u)
}

func TestChartRendersTheCIValuesAsTheGoldenFiles(t *testing.T) {
	for _, c := range ciValues(t, hubChart) {
		name, values := c.name, c.values
		t.Run(name, func(t *testing.T) {
			got, err := renderHub(t, values).YAML()
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "chart", name+".golden.yaml")
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run TestChartRendersTheCIValuesAsTheGoldenFiles -update to write it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the render of ci/%s-values.yaml differs from %s; if the change is meant, run with -update and review the diff:\n%s", name, golden, lineDiff(string(want), string(got)))
			}
		})
	}
}

// lineDiff shows the first lines where two texts part.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  golden: %q\n  render: %q", i+1, wl, gl)
		}
	}
	return ""
}

func TestChartsLintWithEachCIValuesFile(t *testing.T) {
	for _, chart := range []string{hubChart, agentChart} {
		for _, c := range ciValues(t, chart) {
			name, values := c.name, c.values
			t.Run(filepath.Base(chart)+"/"+name, func(t *testing.T) {
				for _, msg := range helmtest.Lint(chart, hubNamespace, values) {
					t.Error(msg)
				}
			})
		}
	}
}

// source returns values' i-th source, to change in place.
func source(values map[string]any, i int) map[string]any {
	return values["sources"].([]any)[i].(map[string]any)
}

func TestChartRefusesWhatCannotWork(t *testing.T) {
	secret := func(name string) map[string]any { return map[string]any{"existingSecret": name} }
	tests := []struct {
		name string
		edit func(v map[string]any)
		want string
	}{
		{"no sources", func(v map[string]any) { v["sources"] = []any{} },
			"sources: no fleet repository to follow"},
		{"an ssh:// source without its key", func(v map[string]any) { source(v, 0)["url"] = "ssh://git@git.example.com/acme/fleet.git" },
			"sources[0] (acme): ssh://git@git.example.com/acme/fleet.git is an SSH URL; name the Secret holding its private key in git.sshKey.existingSecret"},
		{"a git@host:path source without its key", func(v map[string]any) { source(v, 0)["url"] = "git@github.com:acme/fleet.git" },
			"is an SSH URL; name the Secret holding its private key"},
		{"an SSH key for an https source", func(v map[string]any) { source(v, 0)["git"] = map[string]any{"sshKey": secret("acme-ssh")} },
			"git.sshKey is set but https://git.example.com/acme/fleet.git is not an SSH URL"},
		{"a password and an SSH key", func(v map[string]any) {
			source(v, 0)["url"] = "ssh://git@git.example.com/acme/fleet.git"
			source(v, 0)["git"] = map[string]any{"sshKey": secret("acme-ssh"), "password": secret("acme-git")}
		}, "git.password and git.sshKey exclude each other"},
		{"credentials in the URL", func(v map[string]any) { source(v, 0)["url"] = "https://bot:hunter2@git.example.com/acme/fleet.git" },
			"the url carries credentials; put the password in a Secret"},
		{"TLS off without the loopback flag", func(v map[string]any) { v["tls"] = map[string]any{"existingSecret": ""} },
			"tls.existingSecret: the tunnel needs a certificate"},
		{"no age identity and no KMS", func(v map[string]any) { v["age"] = map[string]any{"existingSecret": ""} },
			"age.existingSecret: the hub needs its age identity"},
		{"an age Secret without keys", func(v map[string]any) {
			v["age"] = map[string]any{"existingSecret": "flotilla-hub-age", "keys": []any{}}
		},
			"age.keys: name the keys of Secret flotilla-hub-age"},
		{"a GitHub forge without its token", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "github", "owner": "acme", "repo": "fleet"}
		}, "sources[0] (acme): statuses.kind github needs a token Secret in statuses.token.existingSecret, or a GitHub App"},
		{"a Gitea forge without its token", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "gitea", "url": "https://gitea.example.com", "owner": "acme", "repo": "fleet"}
		}, "statuses.kind gitea needs the Secret holding its API token"},
		{"a GitLab forge without its token", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "gitlab", "url": "https://gitlab.example.com", "project": "acme/fleet"}
		}, "statuses.kind gitlab needs the Secret holding its API token"},
		{"a GitHub App without its private key", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "github", "owner": "acme", "repo": "fleet",
				"githubApp": map[string]any{"appID": 1, "installationID": 2}}
		}, "statuses.githubApp needs the Secret holding the app's private key"},
		{"a GitHub App without its installation", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "github", "owner": "acme", "repo": "fleet",
				"githubApp": map[string]any{"appID": 1, "privateKey": secret("acme-app")}}
		}, "statuses.githubApp.installationID is required with appID"},
		{"a GitHub token and a GitHub App", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "github", "owner": "acme", "repo": "fleet", "token": secret("acme-token"),
				"githubApp": map[string]any{"appID": 1, "installationID": 2, "privateKey": secret("acme-app")}}
		}, "statuses.token and statuses.githubApp exclude each other"},
		{"a GitHub forge without its repository", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "github", "token": secret("acme-token")}
		}, "statuses.kind github needs statuses.owner and statuses.repo"},
		{"a GitLab forge without its URL", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "gitlab", "project": "acme/fleet", "token": secret("acme-token")}
		}, "statuses.kind gitlab needs the forge's base URL"},
		{"a token for git notes", func(v map[string]any) {
			source(v, 0)["statuses"] = map[string]any{"kind": "notes", "token": secret("acme-token")}
		}, "statuses.token is set but statuses.kind is notes"},
		{"two sources of one name", func(v map[string]any) {
			v["sources"] = append(v["sources"].([]any), map[string]any{"name": "acme", "url": "https://git.example.com/b.git", "tenant": "b"})
		}, "sources[1] (acme): the name acme is used twice"},
		{"two sources writing one namespace", func(v map[string]any) {
			v["sources"] = append(v["sources"].([]any), map[string]any{"name": "b", "url": "https://git.example.com/b.git", "tenant": "b", "namespace": "acme"})
		}, "sources[1] (b): namespace acme is written by another source"},
		{"two sources of one tenant", func(v map[string]any) {
			v["sources"] = append(v["sources"].([]any), map[string]any{"name": "b", "url": "https://git.example.com/b.git", "tenant": "acme", "namespace": "b"})
		}, "sources[1] (b): sources acme and b both follow tenant acme"},
		{"one hub namespace claimed by two sources", func(v map[string]any) {
			source(v, 0)["dispatch"] = map[string]any{"workloadNamespaces": []any{"ml"}}
			v["sources"] = append(v["sources"].([]any), map[string]any{"name": "b", "url": "https://git.example.com/b.git", "tenant": "b",
				"dispatch": map[string]any{"workloadNamespaces": []any{"ml"}}})
		}, "sources[1] (b): sources acme and b both claim hub namespace ml"},
		{"a hub namespace that is no namespace's name", func(v map[string]any) {
			source(v, 0)["dispatch"] = map[string]any{"workloadNamespaces": []any{"ML"}}
		}, "/sources/0/dispatch/workloadNamespaces/0"},
		{"an Ingress without hosts", func(v map[string]any) { v["ingress"] = map[string]any{"enabled": true} },
			"ingress.hosts: an Ingress for the webhooks and plans needs the host names"},
		// The schema's refusals, checked before any template runs.
		{"a source without a tenant", func(v map[string]any) { delete(source(v, 0), "tenant") },
			"missing property 'tenant'"},
		{"a source name with a slash", func(v map[string]any) { source(v, 0)["name"] = "acme/fleet" },
			"/sources/0/name"},
		{"an unknown forge", func(v map[string]any) { source(v, 0)["statuses"] = map[string]any{"kind": "bitbucket"} },
			"/sources/0/statuses/kind"},
		{"an unknown value", func(v map[string]any) { v["replica"] = 3 },
			"additional properties 'replica' not allowed"},
		{"a proxy URL that is not https", func(v map[string]any) {
			v["dispatch"] = map[string]any{"enabled": true, "url": "http://proxy.example.com:9443"}
		}, "/dispatch/url"},
		{"a poll that is no duration", func(v map[string]any) { source(v, 0)["poll"] = "hourly" },
			"/sources/0/poll"},
		{"a negative bound of connections", func(v map[string]any) { v["connections"] = map[string]any{"proxy": map[string]any{"max": -1}} },
			"/connections/proxy/max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := minimalValues(t)
			tt.edit(v)
			_, err := helmtest.Render(hubChart, helmtest.Options{Release: hubRelease, Namespace: hubNamespace, Values: v})
			if err == nil {
				t.Fatalf("the chart installs; want it refused with %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("the chart is refused with\n%v\nwant %q", err, tt.want)
			}
		})
	}
}

// hubFiles writes what the hub's one volume holds into root as the kubelet would
// lay it out under /etc/flotilla: the ConfigMap's config.yaml, with its paths moved
// under root, and each projected file (a stand-in, named after its Secret and key).
// It returns the configuration's path and where each file came from.
func hubFiles(t *testing.T, objs helmtest.Objects, root string) (configPath string, from map[string]string) {
	t.Helper()
	cm := one[corev1.ConfigMap](t, objs, "ConfigMap", hubRelease)
	dep := one[appsv1.Deployment](t, objs, "Deployment", hubRelease)
	c := dep.Spec.Template.Spec.Containers[0]
	var mount string
	for _, m := range c.VolumeMounts {
		if m.Name == "config" {
			mount = m.MountPath
		}
	}
	if mount != "/etc/flotilla" || !slices.Contains(c.Args, "--config=/etc/flotilla/config.yaml") {
		t.Fatalf("the hub reads %v with its volume at %q; want --config=/etc/flotilla/config.yaml", c.Args, mount)
	}
	from = map[string]string{}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name != "config" {
			continue
		}
		if v.Projected == nil {
			t.Fatalf("volume config is %+v, want a projected volume", v.VolumeSource)
		}
		for _, src := range v.Projected.Sources {
			var name string
			var items []corev1.KeyToPath
			switch {
			case src.Secret != nil:
				name, items = "Secret "+src.Secret.Name, src.Secret.Items
			case src.ConfigMap != nil:
				name, items = "ConfigMap "+src.ConfigMap.Name, src.ConfigMap.Items
			default:
				t.Fatalf("the projected volume holds %+v", src)
			}
			for _, it := range items {
				p := filepath.Join(mount, it.Path)
				if prev, dup := from[p]; dup {
					t.Errorf("%s is projected twice: from %s and %s", p, prev, name)
				}
				from[p] = name + " key " + it.Key
			}
		}
	}
	for p, src := range from {
		content := "stand-in for " + src + "\n"
		if p == "/etc/flotilla/config.yaml" {
			content = strings.ReplaceAll(cm.Data["config.yaml"], "/etc/flotilla/", root+"/etc/flotilla/")
		}
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, []byte(content), 0o400); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := from["/etc/flotilla/config.yaml"]; !ok {
		t.Fatal("the hub's volume does not hold config.yaml")
	}
	return filepath.Join(root, "etc", "flotilla", "config.yaml"), from
}

// namedFiles are the files a configuration names, by what they are for.
func namedFiles(cfg *Config) map[string]string {
	out := map[string]string{"tls.certFile": cfg.TLS.CertFile, "tls.keyFile": cfg.TLS.KeyFile}
	for i, f := range cfg.Age.IdentityFiles {
		out[fmt.Sprintf("age.identityFiles[%d]", i)] = f
	}
	for _, s := range cfg.Sources {
		for what, f := range map[string]string{
			"webhookSecretFile": s.WebhookSecretFile, "git.passwordFile": s.Git.PasswordFile, "git.sshKeyFile": s.Git.SSHKeyFile,
			"git.knownHostsFile": s.Git.KnownHostsFile, "git.trustedKeysFile": s.Git.TrustedKeysFile,
			"statuses.tokenFile": s.Statuses.TokenFile, "statuses.privateKeyFile": s.Statuses.PrivateKeyFile,
		} {
			out[s.Name+"."+what] = f
		}
	}
	maps.DeleteFunc(out, func(_, f string) bool { return f == "" })
	return out
}

// The configuration the chart renders is one the hub accepts, and every file it names
// is in the hub's volume, from the Secret the values name.
func TestChartConfigIsOneTheHubLoads(t *testing.T) {
	for _, c := range ciValues(t, hubChart) {
		name, values := c.name, c.values
		t.Run(name, func(t *testing.T) {
			objs := renderHub(t, values)
			root := t.TempDir()
			path, from := hubFiles(t, objs, root)
			cfg, err := LoadConfig(path)
			if err != nil {
				t.Fatalf("the hub refuses the chart's configuration: %v", err)
			}
			for what, f := range namedFiles(cfg) {
				if !strings.HasPrefix(f, root+"/etc/flotilla/secrets/") {
					t.Errorf("%s is %s, outside /etc/flotilla/secrets/", what, f)
				}
				if _, err := os.Stat(f); err != nil {
					t.Errorf("%s names a file the hub's volume does not hold: %v", what, err)
				}
			}
			if !cfg.LeaderElection.Enabled || cfg.LeaderElection.Namespace != hubNamespace || cfg.LeaderElection.Name != hubRelease {
				t.Errorf("leader election %+v; want enabled, the Lease %s/%s", cfg.LeaderElection, hubNamespace, hubRelease)
			}
			if cfg.Dispatch.Listen != "" && cfg.Dispatch.Namespace != hubNamespace {
				t.Errorf("the API proxy's CA is kept in %s, want the release's namespace %s", cfg.Dispatch.Namespace, hubNamespace)
			}
			// What the chart names is what it mounts.
			for _, f := range []string{cfg.TLS.CertFile, cfg.TLS.KeyFile} {
				if got, want := from[strings.TrimPrefix(f, root)], "Secret flotilla-hub-tls key "+filepath.Base(f); got != want {
					t.Errorf("%s comes from %s, want %s", f, got, want)
				}
			}
		})
	}
}

// Each credential of ci/forges-values.yaml reaches the hub from the Secret and key the
// values name, under the file the configuration names for it.
func TestChartMountsEachCredentialFromItsSecret(t *testing.T) {
	objs := renderHub(t, ciValuesOf(t, "forges"))
	root := t.TempDir()
	path, from := hubFiles(t, objs, root)
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"age.identityFiles[0]":           "Secret flotilla-hub-age key identity.agekey",
		"age.identityFiles[1]":           "Secret flotilla-hub-age key next.agekey",
		"tls.certFile":                   "Secret flotilla-hub-tls key tls.crt",
		"tls.keyFile":                    "Secret flotilla-hub-tls key tls.key",
		"acme.webhookSecretFile":         "Secret acme-fleet-webhook key secret",
		"acme.git.passwordFile":          "Secret acme-fleet-git key password",
		"acme.statuses.tokenFile":        "Secret acme-fleet-gitea key token",
		"globex.webhookSecretFile":       "Secret globex-fleet-webhook key github-webhook",
		"globex.git.sshKeyFile":          "Secret globex-fleet-ssh key identity",
		"globex.git.knownHostsFile":      "Secret globex-fleet-ssh key known_hosts",
		"globex.git.trustedKeysFile":     "ConfigMap globex-release-keys key keyring.asc",
		"globex.statuses.privateKeyFile": "Secret globex-github-app key private-key.pem",
		"initech.git.sshKeyFile":         "Secret initech-fleet-ssh key id_ed25519",
		"initech.git.knownHostsFile":     "Secret github-known-hosts key known_hosts",
		"initech.statuses.tokenFile":     "Secret initech-github-token key token",
		"umbrella.git.passwordFile":      "Secret umbrella-fleet-git key token",
		"umbrella.statuses.tokenFile":    "Secret umbrella-fleet-git key token",
	}
	got := map[string]string{}
	for what, f := range namedFiles(cfg) {
		got[what] = from[strings.TrimPrefix(f, root)]
	}
	for what := range want {
		if got[what] != want[what] {
			t.Errorf("%s comes from %q, want %q", what, got[what], want[what])
		}
	}
	for what := range got {
		if _, ok := want[what]; !ok {
			t.Errorf("the configuration names %s (from %s), which the values do not", what, got[what])
		}
	}
	globex := cfg.Sources[1]
	if globex.Namespace != "globex-fleet" || globex.Branch != "production" || globex.Statuses.AppID != 123456 || globex.Statuses.InstallationID != 98765432 {
		t.Errorf("source globex is %+v", globex)
	}
	// Nothing secret is in the release: no Secret object, no credential in the
	// environment or the configuration.
	if s := objs.OfKind("Secret"); len(s) > 0 {
		t.Errorf("the chart renders %d Secrets; every credential must come from an existing one", len(s))
	}
	c := one[appsv1.Deployment](t, objs, "Deployment", hubRelease).Spec.Template.Spec.Containers[0]
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("env %s comes from a Secret; credentials are files", e.Name)
		}
	}
}

// The checksum of the configuration is on the pod template, so that a change of the
// configuration restarts the hub, which reads it once.
func TestChartRestartsTheHubWhenItsConfigurationChanges(t *testing.T) {
	checksum := func(v map[string]any) string {
		objs := renderHub(t, v)
		cm := one[corev1.ConfigMap](t, objs, "ConfigMap", hubRelease)
		dep := one[appsv1.Deployment](t, objs, "Deployment", hubRelease)
		got := dep.Spec.Template.Annotations["checksum/config"]
		// Helm's sha256sum of the rendered template, which is the ConfigMap's YAML as
		// rendered, not as decoded here: only its presence and change are checked.
		if len(got) != 2*sha256.Size || len(cm.Data["config.yaml"]) == 0 {
			t.Fatalf("checksum/config is %q", got)
		}
		return got
	}
	v := minimalValues(t)
	before := checksum(v)
	source(v, 0)["poll"] = "5m"
	if after := checksum(v); after == before {
		t.Errorf("checksum/config stays %s when the configuration changes", before)
	}
}

func TestChartDeploymentIsRestrictedAndReadyWhenHealthy(t *testing.T) {
	objs := renderHub(t, minimalValues(t))
	dep := one[appsv1.Deployment](t, objs, "Deployment", hubRelease)
	spec := dep.Spec.Template.Spec
	if *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2: a leader and a standby", *dep.Spec.Replicas)
	}
	if ru := dep.Spec.Strategy.RollingUpdate; dep.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v, want a rolling update that keeps both replicas", dep.Spec.Strategy)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image != "ghcr.io/flotilla-gitops/flotilla-hub:0.1.0" {
		t.Errorf("image %s, want the chart's appVersion", c.Image)
	}
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || sc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("security context %+v / %+v, want the restricted profile: non-root 65532, read-only root, no escalation, no capabilities, RuntimeDefault seccomp", psc, sc)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for probe, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}, "startup": {c.StartupProbe, "/healthz"}} {
		if want.p == nil || want.p.HTTPGet == nil || want.p.HTTPGet.Path != want.path || want.p.HTTPGet.Port != intstr.FromString("http") {
			t.Errorf("%s probe %+v, want GET %s on the HTTP port", probe, want.p, want.path)
		}
	}
	if ports["http"] != 8080 || ports["tunnel"] != 8443 {
		t.Errorf("container ports %v", ports)
	}
	// Routing by leadership: the leader labels its own Pod, named by the downward API.
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("env from the downward API %v, want POD_NAME and POD_NAMESPACE", env)
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v, want memory requested and limited", c.Resources)
	}
	if a := spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 ||
		len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
		t.Errorf("affinity %+v, want the replicas to prefer different nodes", spec.Affinity)
	}
	for _, tsc := range spec.TopologySpreadConstraints {
		if tsc.WhenUnsatisfiable != corev1.ScheduleAnyway {
			t.Errorf("topology spread %+v must not keep a replica from scheduling", tsc)
		}
	}
	if spec.ServiceAccountName != hubRelease {
		t.Errorf("service account %s", spec.ServiceAccountName)
	}

	pdb := one[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", hubRelease)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil ||
		!labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("PodDisruptionBudget %+v, want one replica of the hub's evictable at a time", pdb.Spec)
	}
}

// The tunnel, the HTTP endpoints and the leader's API proxy reach the leader alone,
// through the label it sets on its own Pod; the API proxy Kueue reaches and the metrics
// Service reach every replica.
func TestChartRoutesToTheLeaderAndScrapesEveryReplica(t *testing.T) {
	objs := renderHub(t, ciValuesOf(t, "dispatch"))
	dep := one[appsv1.Deployment](t, objs, "Deployment", hubRelease)
	pod := labels.Set(dep.Spec.Template.Labels)
	leading := labels.Merge(pod, labels.Set{leader.Label: "true"})
	ports := map[string]bool{}
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	tests := []struct {
		service    string
		leaderOnly bool
		port       string
	}{
		{hubRelease + "-tunnel", true, "tunnel"},
		{hubRelease + "-http", true, "http"},
		{hubRelease + "-proxy-leader", true, "proxy"},
		{hubRelease + "-proxy", false, "proxy"},
		{hubRelease + "-metrics", false, "http"},
	}
	for _, tt := range tests {
		t.Run(tt.service, func(t *testing.T) {
			svc := one[corev1.Service](t, objs, "Service", tt.service)
			sel := labels.SelectorFromSet(svc.Spec.Selector)
			if !sel.Matches(leading) {
				t.Errorf("selector %v does not reach the leader's Pod %v", svc.Spec.Selector, leading)
			}
			if got := sel.Matches(pod); got == tt.leaderOnly {
				t.Errorf("selector %v reaches a replica that does not lead: %v, want %v", svc.Spec.Selector, got, !tt.leaderOnly)
			}
			for _, p := range svc.Spec.Ports {
				if p.TargetPort.StrVal != tt.port || !ports[p.TargetPort.StrVal] {
					t.Errorf("port %s targets %v; the container has %v", p.Name, p.TargetPort, ports)
				}
			}
		})
	}
	if svc := one[corev1.Service](t, objs, "Service", hubRelease+"-tunnel"); svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("ci/dispatch-values.yaml asks for a ClusterIP tunnel Service, got %s", svc.Spec.Type)
	}
	if svc := one[corev1.Service](t, renderHub(t, minimalValues(t)), "Service", hubRelease+"-tunnel"); svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.Ports[0].Port != 443 {
		t.Errorf("by default the tunnel is a %s Service on port %d, want a LoadBalancer on 443: the hub terminates TLS itself", svc.Spec.Type, svc.Spec.Ports[0].Port)
	}

	// The proxy's URL is the proxy Service as the hub's Kueue, in the cluster, reaches it.
	cfg := one[corev1.ConfigMap](t, objs, "ConfigMap", hubRelease).Data["config.yaml"]
	if want := "url: https://flotilla-hub-proxy.flotilla-system.svc:9443"; !strings.Contains(cfg, want) {
		t.Errorf("config.yaml lacks %q:\n%s", want, cfg)
	}

	// The Ingress carries the webhooks and plans to the leader's HTTP Service, and
	// nothing else.
	ing := one[networkingv1.Ingress](t, objs, "Ingress", hubRelease)
	var paths []string
	for _, r := range ing.Spec.Rules {
		for _, p := range r.HTTP.Paths {
			paths = append(paths, r.Host+p.Path)
			if p.Backend.Service == nil || p.Backend.Service.Name != hubRelease+"-http" {
				t.Errorf("path %s goes to %+v, want the HTTP Service", p.Path, p.Backend)
			}
		}
	}
	if want := []string{"hub.example.com/webhooks/", "hub.example.com/plans/"}; !slices.Equal(paths, want) {
		t.Errorf("the Ingress routes %v, want %v", paths, want)
	}
	if !strings.Contains(cfg, "publicURL: https://hub.example.com") {
		t.Errorf("config.yaml does not link plans at the Ingress's host:\n%s", cfg)
	}

	sm := objs.Find("ServiceMonitor", hubRelease)
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	smSel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	metrics := one[corev1.Service](t, objs, "Service", hubRelease+"-metrics")
	for _, svc := range objs.OfKind("Service") {
		if got, want := labels.SelectorFromSet(smSel).Matches(labels.Set(svc.GetLabels())), svc.GetName() == metrics.Name; got != want {
			t.Errorf("the ServiceMonitor selects Service %s: %v, want %v", svc.GetName(), got, want)
		}
	}
}

// documentedRBAC reads the roles charts/flotilla-hub/RBAC.md documents: the yaml at
// its end, whose names and namespaces are placeholders.
func documentedRBAC(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(hubChart, "RBAC.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := bytes.Cut(doc, []byte("```yaml\n"))
	if ok {
		block, _, ok = bytes.Cut(block, []byte("```"))
	}
	if !ok {
		t.Fatal("RBAC.md has no yaml block")
	}
	var out []*unstructured.Unstructured
	for _, d := range bytes.Split(block, []byte("\n---\n")) {
		u := &unstructured.Unstructured{}
		if err := yaml.UnmarshalStrict(d, &u.Object); err != nil {
			t.Fatalf("RBAC.md: %v", err)
		}
		out = append(out, u)
	}
	return out
}

// grant is one thing a rule allows.
type grant = helmtest.Grant

var grants = helmtest.Grants

// RBAC.md is the one list of what the hub may do: the chart's roles grant exactly its
// rules, in the namespaces it says, bound to the hub's ServiceAccount alone.
func TestChartRBACIsExactlyTheDocumentedRules(t *testing.T) {
	for _, c := range ciValues(t, hubChart) {
		name, values := c.name, c.values
		t.Run(name, func(t *testing.T) {
			objs := renderHub(t, values)
			dispatch := objs.Find("Service", hubRelease+"-proxy") != nil
			var sourceNamespaces []string
			for _, s := range values["sources"].([]any) {
				s := s.(map[string]any)
				ns, _ := s["namespace"].(string)
				if ns == "" {
					ns = s["tenant"].(string)
				}
				sourceNamespaces = append(sourceNamespaces, ns)
			}
			// What the chart must render: RBAC.md's roles, the placeholders filled in.
			want := map[string][]grant{}
			for _, d := range documentedRBAC(t) {
				if strings.HasSuffix(d.GetName(), "-dispatch") && !dispatch {
					continue
				}
				rules := helmtest.Typed[rbacv1.ClusterRole](t, d).Rules
				if d.GetKind() == "ClusterRole" {
					want["ClusterRole/"+d.GetName()] = grants(rules)
					continue
				}
				namespaces := map[string][]string{"RELEASE-NAMESPACE": {hubNamespace}, "EACH-SOURCE-NAMESPACE": sourceNamespaces, "KUEUE-NAMESPACE": {"kueue-system"}}[d.GetNamespace()]
				if len(namespaces) == 0 {
					t.Fatalf("RBAC.md: Role %s in %q, which is no placeholder the test knows", d.GetName(), d.GetNamespace())
				}
				for _, ns := range namespaces {
					gs := grants(rules)
					if !dispatch {
						// The API proxy's CA is written only with dispatch.
						gs = slices.DeleteFunc(gs, func(g grant) bool { return g.Resource == "secrets" && d.GetNamespace() == "RELEASE-NAMESPACE" })
					}
					want["Role/"+ns+"/"+d.GetName()] = gs
				}
			}
			got := map[string][]grant{}
			subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: hubRelease, Namespace: hubNamespace}}
			bound := map[string]bool{}
			for _, u := range objs {
				switch u.GetKind() {
				case "ClusterRole":
					got["ClusterRole/"+u.GetName()] = grants(helmtest.Typed[rbacv1.ClusterRole](t, u.Unstructured).Rules)
				case "Role":
					got["Role/"+u.GetNamespace()+"/"+u.GetName()] = grants(helmtest.Typed[rbacv1.Role](t, u.Unstructured).Rules)
				case "ClusterRoleBinding":
					b := helmtest.Typed[rbacv1.ClusterRoleBinding](t, u.Unstructured)
					if !slices.Equal(b.Subjects, subject) || b.RoleRef.Kind != "ClusterRole" {
						t.Errorf("ClusterRoleBinding %s binds %+v to %+v", b.Name, b.RoleRef, b.Subjects)
					}
					bound["ClusterRole/"+b.RoleRef.Name] = true
				case "RoleBinding":
					b := helmtest.Typed[rbacv1.RoleBinding](t, u.Unstructured)
					if !slices.Equal(b.Subjects, subject) || b.RoleRef.Kind != "Role" {
						t.Errorf("RoleBinding %s/%s binds %+v to %+v", b.Namespace, b.Name, b.RoleRef, b.Subjects)
					}
					bound["Role/"+b.Namespace+"/"+b.RoleRef.Name] = true
				}
			}
			for role := range got {
				if !bound[role] {
					t.Errorf("%s is bound to nothing", role)
				}
			}
			for _, role := range slices.Sorted(maps.Keys(want)) {
				if !slices.Equal(got[role], want[role]) {
					t.Errorf("%s grants\n%v\nRBAC.md documents\n%v", role, got[role], want[role])
				}
			}
			for _, role := range slices.Sorted(maps.Keys(got)) {
				if _, ok := want[role]; !ok {
					t.Errorf("the chart renders %s, which RBAC.md does not document: %v", role, got[role])
				}
			}
		})
	}
}

// serviceMonitorCRD stands in for the Prometheus Operator's CRD, which no module this
// project requires ships: the API server then checks the ServiceMonitor's group,
// version, kind and scope, though not its fields.
func serviceMonitorCRD() *apiextensionsv1.CustomResourceDefinition {
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "servicemonitors.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "servicemonitors", Singular: "servicemonitor", Kind: "ServiceMonitor", ListKind: "ServiceMonitorList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", Required: []string{"spec"},
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Required: []string{"selector", "endpoints"}, XPreserveUnknownFields: &preserve},
					},
				}}}},
		},
	}
}

func established(ctx context.Context, c client.Client, name string) (bool, string) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
		return false, err.Error()
	}
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true, ""
		}
	}
	return false, "not established"
}

// The chart installs on a real API server: its CRDs, then every object of each ci/
// values file, server-side applied in Helm's order, as Helm v4 applies them. A field
// the API server does not know, a wrong type or an invalid name fails here.
func TestChartAppliesToARealAPIServer(t *testing.T) {
	ctx := t.Context()
	admin := planes[0].Client
	crds, err := helmtest.CRDs(hubChart)
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) == 0 {
		t.Fatal("the chart has no CRDs")
	}
	apply := func(u *unstructured.Unstructured) error {
		return admin.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), client.FieldOwner("helm"), client.ForceOwnership)
	}
	for _, crd := range crds {
		if err := apply(crd); err != nil {
			t.Fatalf("applying CRD %s: %v", crd.GetName(), err)
		}
	}
	if err := admin.Create(ctx, serviceMonitorCRD()); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, name := range append([]string{serviceMonitorCRD().Name}, func() (names []string) {
		for _, c := range crds {
			names = append(names, c.GetName())
		}
		return names
	}()...) {
		poll.Until(t, "CRD "+name+" established", func() (bool, string) { return established(ctx, admin, name) })
	}
	// Kueue's namespace is there before the hub is installed with dispatch.
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, c := range ciValues(t, hubChart) {
		name, values := c.name, c.values
		t.Run(name, func(t *testing.T) {
			// A release of its own per case, so that the cases' objects do not meet.
			ns := "hub-" + name
			if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				t.Fatal(err)
			}
			objs := helmtest.MustRender(t, hubChart, helmtest.Options{Release: ns, Namespace: ns, Values: values, Config: planes[0].Config})
			kinds := map[string]int{}
			for _, u := range objs {
				if err := apply(u.Unstructured); err != nil {
					t.Errorf("applying %s %s/%s from %s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), u.Template, err)
				}
				kinds[u.GetKind()]++
			}
			for _, kind := range []string{"ServiceAccount", "ConfigMap", "Role", "Service", "Deployment", "PodDisruptionBudget"} {
				if kinds[kind] == 0 {
					t.Errorf("no %s applied", kind)
				}
			}
			// Only dispatch needs a right beyond the namespaces the values name.
			dispatch, _, _ := unstructured.NestedBool(values, "dispatch", "enabled")
			if got := kinds["ClusterRole"] > 0; got != dispatch {
				t.Errorf("%d ClusterRoles applied with dispatch %t; want some only with dispatch", kinds["ClusterRole"], dispatch)
			}
			// What was stored is what was rendered: the API server dropped no field of
			// the Deployment as unknown.
			var dep appsv1.Deployment
			if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: ns + "-flotilla-hub"}, &dep); err != nil {
				t.Fatal(err)
			}
			if got := dep.Spec.Template.Spec.Volumes[0].Projected; got == nil || len(got.Sources) < 3 {
				t.Errorf("the stored Deployment's volume is %+v", dep.Spec.Template.Spec.Volumes[0])
			}
		})
	}
}

// The bounds of each listener's connections reach the hub's configuration; what the
// values leave out keeps the hub's default.
func TestChartPassesTheConnectionBoundsToTheHub(t *testing.T) {
	v := minimalValues(t)
	v["connections"] = map[string]any{"tunnel": map[string]any{"max": 50000}, "proxy": map[string]any{"max": 64, "idleTimeout": "30s"}}
	path, _ := hubFiles(t, renderHub(t, v), t.TempDir())
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatalf("the hub refuses the chart's configuration: %v", err)
	}
	for name, tt := range map[string]struct{ got, want ListenerLimits }{
		"tunnel": {cfg.Connections.Tunnel, ListenerLimits{Max: 50000, IdleTimeout: Duration(defaultIdleTimeout)}},
		"http":   {cfg.Connections.HTTP, ListenerLimits{Max: defaultHTTPConnections, IdleTimeout: Duration(defaultIdleTimeout)}},
		"proxy":  {cfg.Connections.Proxy, ListenerLimits{Max: 64, IdleTimeout: Duration(30 * time.Second)}},
	} {
		if tt.got != tt.want {
			t.Errorf("connections.%s = %+v, want %+v", name, tt.got, tt.want)
		}
	}
}

// The chart leaves Go's profiles off, and passes a loopback listener through when asked.
func TestChartPassesTheProfilesListenerToTheHub(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pprof map[string]any
		want  string
	}{
		{"off by default", nil, ""},
		{"on loopback", map[string]any{"listen": "127.0.0.1:6060"}, "127.0.0.1:6060"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := minimalValues(t)
			if tc.pprof != nil {
				v["pprof"] = tc.pprof
			}
			path, _ := hubFiles(t, renderHub(t, v), t.TempDir())
			cfg, err := LoadConfig(path)
			if err != nil {
				t.Fatalf("the hub refuses the chart's configuration: %v", err)
			}
			if cfg.Pprof.Listen != tc.want || cfg.Pprof.AllowRemote {
				t.Fatalf("pprof %+v, want listen %q on loopback", cfg.Pprof, tc.want)
			}
		})
	}
}

// coversPort reports whether a NetworkPolicy rule's ports take in a container port: a
// rule without ports takes in every one.
func coversPort(rule networkingv1.NetworkPolicyIngressRule, cp corev1.ContainerPort) bool {
	if len(rule.Ports) == 0 {
		return true
	}
	for _, p := range rule.Ports {
		if cmpProtocol(p.Protocol) != cmpProtocol(&cp.Protocol) {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String && p.Port.StrVal == cp.Name:
			return true
		case p.Port.Type == intstr.Int && p.EndPort != nil && p.Port.IntVal <= cp.ContainerPort && cp.ContainerPort <= *p.EndPort:
			return true
		case p.Port.Type == intstr.Int && p.Port.IntVal == cp.ContainerPort:
			return true
		}
	}
	return false
}

// cmpProtocol is a protocol as the API server defaults it.
func cmpProtocol(p *corev1.Protocol) corev1.Protocol {
	if p == nil || *p == "" {
		return corev1.ProtocolTCP
	}
	return *p
}

// admits reports whether a rule admits a Pod with podLabels in namespace ns, the
// policy's own namespace being policyNS. A rule without peers admits every source, and
// an address block is taken to admit any Pod.
func admits(t *testing.T, rule networkingv1.NetworkPolicyIngressRule, policyNS, ns string, podLabels labels.Set) bool {
	t.Helper()
	if len(rule.From) == 0 {
		return true
	}
	matches := func(s *metav1.LabelSelector, l labels.Set) bool {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatalf("selector %+v: %v", s, err)
		}
		return sel.Matches(l)
	}
	for _, peer := range rule.From {
		if peer.IPBlock != nil {
			return true
		}
		inNamespace := ns == policyNS
		if peer.NamespaceSelector != nil {
			inNamespace = matches(peer.NamespaceSelector, labels.Set{corev1.LabelMetadataName: ns})
		}
		if inNamespace && (peer.PodSelector == nil || matches(peer.PodSelector, podLabels)) {
			return true
		}
	}
	return false
}

// The API proxy holds a token for every worker's Kubernetes API. With networkPolicy on,
// its port admits the hub's Kueue and the hub's own replicas alone (a standby relays to
// the leader's proxy), and every other port of the hub's Pods stays
// open to its callers, from anywhere. The ports are the rendered Deployment's, so that
// a port added without a rule fails here; the policy is off unless asked for.
func TestChartNetworkPolicyAdmitsOnlyKueueAndTheHubToTheProxyAndLeavesEveryOtherPortOpen(t *testing.T) {
	for _, c := range ciValues(t, hubChart) {
		if nps := renderHub(t, c.values).OfKind("NetworkPolicy"); len(nps) != 0 {
			t.Errorf("ci/%s-values.yaml renders %d NetworkPolicies; want none unless networkPolicy.enabled", c.name, len(nps))
		}
	}
	kueuePod := labels.Set{"app.kubernetes.io/name": "kueue", "control-plane": "controller-manager", "pod-template-hash": "5d8f7c"}
	type tcase struct {
		name           string
		values         map[string]any
		kueueNamespace string
		kueuePod       labels.Set
	}
	var tests []tcase
	for _, c := range ciValues(t, hubChart) {
		c.values["networkPolicy"] = map[string]any{"enabled": true}
		tests = append(tests, tcase{c.name, c.values, "kueue-system", kueuePod})
	}
	own := ciValuesOf(t, "dispatch")
	own["dispatch"].(map[string]any)["kueueNamespace"] = "batch-kueue"
	own["networkPolicy"] = map[string]any{"enabled": true, "kueuePodSelector": map[string]any{"matchLabels": map[string]any{"app": "hub-kueue"}}}
	tests = append(tests, tcase{"a Kueue of its own labels and namespace", own, "batch-kueue", labels.Set{"app": "hub-kueue"}})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := renderHub(t, tt.values)
			dep := one[appsv1.Deployment](t, objs, "Deployment", hubRelease)
			np := one[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", hubRelease)
			pod := labels.Set(dep.Spec.Template.Labels)
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil || !sel.Matches(pod) || !sel.Matches(labels.Merge(pod, labels.Set{leader.Label: "true"})) {
				t.Errorf("the policy selects %v (%v); want the hub's Pods %v, leading or not", np.Spec.PodSelector, err, pod)
			}
			if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
				t.Errorf("policy types %v; want Ingress alone, the hub's own requests unrestricted", np.Spec.PolicyTypes)
			}
			// The proxy's port is the one its Service targets.
			proxyPort := ""
			if svc := objs.Find("Service", hubRelease+"-proxy"); svc != nil {
				proxyPort = helmtest.Typed[corev1.Service](t, svc).Spec.Ports[0].TargetPort.StrVal
			}
			ports := dep.Spec.Template.Spec.Containers[0].Ports
			if proxyPort != "" && !slices.ContainsFunc(ports, func(p corev1.ContainerPort) bool { return p.Name == proxyPort }) {
				t.Fatalf("the proxy Service targets port %q, which the Deployment does not have: %v", proxyPort, ports)
			}
			for _, cp := range ports {
				var rules []networkingv1.NetworkPolicyIngressRule
				for _, r := range np.Spec.Ingress {
					if coversPort(r, cp) {
						rules = append(rules, r)
					}
				}
				admitted := func(ns string, l labels.Set) bool {
					return slices.ContainsFunc(rules, func(r networkingv1.NetworkPolicyIngressRule) bool { return admits(t, r, hubNamespace, ns, l) })
				}
				if cp.Name != proxyPort {
					if !slices.ContainsFunc(rules, func(r networkingv1.NetworkPolicyIngressRule) bool { return len(r.From) == 0 }) {
						t.Errorf("port %s (%d) is not open to every caller: the rules that take it in are %+v", cp.Name, cp.ContainerPort, rules)
					}
					continue
				}
				for _, caller := range []struct {
					what string
					ns   string
					pod  labels.Set
					want bool
				}{
					{"the hub's Kueue", tt.kueueNamespace, tt.kueuePod, true},
					{"another Pod in Kueue's namespace", tt.kueueNamespace, labels.Set{"app": "other"}, false},
					{"a Pod labelled like Kueue elsewhere", "tenant-a", tt.kueuePod, false},
					{"a Pod in the hub's namespace", hubNamespace, labels.Set{"app": "other"}, false},
					{"another replica of the hub, relaying to the leader", hubNamespace, pod, true},
				} {
					if got := admitted(caller.ns, caller.pod); got != caller.want {
						t.Errorf("the proxy's port admits %s (%s, %v): %t, want %t", caller.what, caller.ns, caller.pod, got, caller.want)
					}
				}
			}
			// The API server takes the policy as rendered: its named ports, its selectors.
			np.Namespace, np.ResourceVersion = "default", ""
			if err := planes[0].Client.Create(t.Context(), np, client.DryRunAll); err != nil {
				t.Errorf("the API server refuses the NetworkPolicy: %v", err)
			}
		})
	}
}
