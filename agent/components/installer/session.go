package installer

import (
	"context"
	"fmt"
	"log/slog"

	"helm.sh/helm/v4/pkg/action"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// The client's rate limits: client-go's defaults (5 requests a second) would make a
// brownfield scan of Kueue's sixty-odd objects take seconds of throttling.
const (
	clientQPS   = 50
	clientBurst = 100
)

// session is one run's connection to the worker: the clients every component shares,
// and one Helm configuration per component, since Helm keeps a release's records in its
// namespace.
type session struct {
	log       *slog.Logger
	config    *rest.Config
	clientset kubernetes.Interface
	dynamic   dynamic.Interface
	discovery discovery.CachedDiscoveryInterface
	mapper    meta.RESTMapper
	helm      map[components.Component]*action.Configuration
}

// connect builds the session's clients and checks that the API server answers: an
// unreachable worker is the run's error, not a component's.
func (in *Installer) connect(ctx context.Context) (*session, error) {
	if in.Config == nil {
		return nil, fmt.Errorf("no configuration of the worker's API server")
	}
	cfg := rest.CopyConfig(in.Config)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = clientQPS, clientBurst
	}
	log := in.logger()
	cfg.WarningHandlerWithContext = warningLogger{log: log}
	cfg.WarningHandler = nil
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the worker's API server %s: %w", cfg.Host, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the worker's API server %s: %w", cfg.Host, err)
	}
	if _, err := cs.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
		return nil, fmt.Errorf("the worker's API server %s does not answer: %w", cfg.Host, err)
	}
	dc := memory.NewMemCacheClient(cs.Discovery())
	s := &session{
		log:       log,
		config:    cfg,
		clientset: cs,
		dynamic:   dyn,
		discovery: dc,
		mapper:    restmapper.NewDeferredDiscoveryRESTMapper(dc),
		helm:      map[components.Component]*action.Configuration{},
	}
	for _, c := range components.All() {
		hc := action.NewConfiguration(action.ConfigurationSetLogger(log.With("component", string(c)).Handler()))
		if err := hc.Init(s.getter(components.Namespace(c)), components.Namespace(c), "secret"); err != nil {
			return nil, fmt.Errorf("setting up Helm for %s: %w", c, err)
		}
		s.helm[c] = hc
	}
	return s, nil
}

func (s *session) getter(namespace string) *restClientGetter {
	return &restClientGetter{s: s, namespace: namespace}
}

// restClientGetter hands Helm the worker's rest.Config. Helm's own getter reads
// kubeconfig files and command-line flags; the installer has neither, since its
// kubeconfig arrives on standard input and is never written to disk.
type restClientGetter struct {
	s         *session
	namespace string
}

func (g *restClientGetter) ToRESTConfig() (*rest.Config, error) {
	return rest.CopyConfig(g.s.config), nil
}

func (g *restClientGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	return g.s.discovery, nil
}

func (g *restClientGetter) ToRESTMapper() (meta.RESTMapper, error) { return g.s.mapper, nil }

func (g *restClientGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig { return namespaceOnly{g} }

// namespaceOnly is the kubeconfig loader Helm's kube client asks for the namespace of
// objects that name none; everything else comes from the rest.Config.
type namespaceOnly struct{ g *restClientGetter }

func (n namespaceOnly) RawConfig() (clientcmdapi.Config, error) { return clientcmdapi.Config{}, nil }
func (n namespaceOnly) ClientConfig() (*rest.Config, error)     { return n.g.ToRESTConfig() }
func (n namespaceOnly) Namespace() (string, bool, error)        { return n.g.namespace, true, nil }
func (n namespaceOnly) ConfigAccess() clientcmd.ConfigAccess {
	return &clientcmd.ClientConfigLoadingRules{}
}

// warningLogger logs the API server's warnings (deprecated APIs, unknown fields) instead
// of client-go's default of printing them on stderr, where they would break the JSON log.
type warningLogger struct{ log *slog.Logger }

func (w warningLogger) HandleWarningHeaderWithContext(ctx context.Context, code int, _ string, message string) {
	if code != 299 || message == "" {
		return
	}
	w.log.WarnContext(ctx, "the API server warns", "warning", message)
}
