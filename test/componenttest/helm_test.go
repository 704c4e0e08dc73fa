package componenttest_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flotilla-gitops/flotilla/test/componenttest"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// The releases as the agent installs them: release name and namespace by component, the charts'
// versions (those go.mod requires, packaged by `make generate`) and the release images.
var releases = map[componenttest.Component]struct {
	name, namespace, version, repository string
}{
	componenttest.Kueue:  {"kueue", "kueue-system", "v0.17.0", "registry.k8s.io/kueue/kueue"},
	componenttest.JobSet: {"jobset", "jobset-system", "v0.11.1", "registry.k8s.io/jobset/jobset"},
}

// image is the release image of c that the tests install.
func image(c componenttest.Component) string {
	r := releases[c]
	return r.repository + ":" + r.version
}

// values are the chart values the tests install c with: the release image instead of the
// charts' staging builds, and for Kueue the configuration kueueConfig(qps).
func values(c componenttest.Component, qps int) map[string]any {
	r := releases[c]
	img := map[string]any{"repository": r.repository, "tag": r.version, "pullPolicy": "IfNotPresent"}
	if c == componenttest.JobSet {
		return map[string]any{"image": img}
	}
	return map[string]any{
		"controllerManager": map[string]any{"manager": map[string]any{"image": img}},
		"managerConfig":     map[string]any{"controllerManagerConfigYaml": kueueConfig(qps)},
	}
}

// kueueConfig is the chart's default configuration with the integrations a hub enables for
// MultiKueue and the client's queries per second as given: a configuration change that a test
// can make.
func kueueConfig(qps int) string {
	return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
metrics:
  bindAddress: :8443
webhook:
  port: 9443
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
clientConnection:
  qps: %d
  burst: 100
integrations:
  frameworks:
  - batch/job
  - jobset.x-k8s.io/jobset
`, qps)
}

// loadChart loads c's chart from the archive the agent embeds.
func loadChart(t *testing.T, c componenttest.Component) *chart.Chart {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	r := releases[c]
	file := filepath.Join(root, "agent", "components", "charts", fmt.Sprintf("%s-%s.tgz", c, r.version))
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("loading %s: %v", file, err)
	}
	return ch
}

// helm returns Helm's action configuration for c's release namespace on plane, storing releases
// in Secrets as Helm does by default.
func helm(t *testing.T, plane *controlplane.ControlPlane, c componenttest.Component) *action.Configuration {
	t.Helper()
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err := cfg.Init(newGetter(t, plane), releases[c].namespace, "secret"); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// install installs c's chart on plane with the Helm SDK, without waiting: the Kubelet is what
// makes the release's Deployment ready.
func install(t *testing.T, plane *controlplane.ControlPlane, c componenttest.Component, vals map[string]any) {
	t.Helper()
	r := releases[c]
	in := action.NewInstall(helm(t, plane, c))
	in.ReleaseName, in.Namespace, in.CreateNamespace = r.name, r.namespace, true
	in.WaitStrategy = kube.HookOnlyStrategy
	if _, err := in.RunWithContext(t.Context(), loadChart(t, c), vals); err != nil {
		t.Fatalf("helm install %s: %v", r.name, err)
	}
}

// upgrade upgrades c's release on plane to its chart with vals, without waiting.
func upgrade(t *testing.T, plane *controlplane.ControlPlane, c componenttest.Component, vals map[string]any) {
	t.Helper()
	r := releases[c]
	up := action.NewUpgrade(helm(t, plane, c))
	up.Namespace = r.namespace
	up.WaitStrategy = kube.HookOnlyStrategy
	if _, err := up.RunWithContext(t.Context(), r.name, loadChart(t, c), vals); err != nil {
		t.Fatalf("helm upgrade %s: %v", r.name, err)
	}
}

// uninstall removes c's release from plane, without waiting.
func uninstall(t *testing.T, plane *controlplane.ControlPlane, c componenttest.Component) {
	t.Helper()
	un := action.NewUninstall(helm(t, plane, c))
	un.WaitStrategy = kube.HookOnlyStrategy
	if _, err := un.Run(releases[c].name); err != nil {
		t.Fatalf("helm uninstall %s: %v", releases[c].name, err)
	}
}

// getter hands Helm the plane's admin credentials (genericclioptions.RESTClientGetter).
type getter struct {
	loader clientcmd.ClientConfig
	config *rest.Config
	disc   discovery.CachedDiscoveryInterface
}

func newGetter(t *testing.T, plane *controlplane.ControlPlane) *getter {
	t.Helper()
	loader, err := clientcmd.NewClientConfigFromBytes(plane.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rest.CopyConfig(plane.Config))
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(plane.Config)
	// client-go's default of 5 requests a second makes Helm take most of a minute over the
	// Kueue chart's hundred objects; an API server of its own can take them at once.
	cfg.QPS, cfg.Burst = 500, 1000
	return &getter{loader: loader, config: cfg, disc: memory.NewMemCacheClient(dc)}
}

func (g *getter) ToRESTConfig() (*rest.Config, error) { return rest.CopyConfig(g.config), nil }

func (g *getter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) { return g.disc, nil }

func (g *getter) ToRESTMapper() (meta.RESTMapper, error) {
	return restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(g.disc), g.disc, nil), nil
}

func (g *getter) ToRawKubeConfigLoader() clientcmd.ClientConfig { return g.loader }
