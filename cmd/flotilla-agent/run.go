package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/converge"
	"github.com/flotilla-gitops/flotilla/agent/inventory"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
	"github.com/flotilla-gitops/flotilla/cmd/internal/workerconfig"
)

// runAgent runs the agent until ctx ends. Its errors are logged, as JSON like every other
// line, before it returns errReported.
func runAgent(ctx context.Context, cfg *config, stderr io.Writer, getenv func(string) string) error {
	log := newLogger(stderr, cfg.LogLevel)
	if err := runAgentWith(ctx, cfg, log, getenv); err != nil && ctx.Err() == nil {
		log.Error("the agent stopped", "error", err)
		return errReported
	}
	log.Info("the agent stopped")
	return nil
}

// newLogger logs JSON to w, and makes client-go's and controller-runtime's logs the same
// JSON: one format for the worker's log collector to parse.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	klog.SetSlogLogger(log)
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	return log
}

func runAgentWith(ctx context.Context, cfg *config, log *slog.Logger, getenv func(string) string) error {
	// Listening first: a port in use is an error at once, and the liveness probe answers
	// while the agent reads the cluster.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening for health and metrics: %w", err)
	}
	ref := &agentRef{}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return serveHealth(ctx, ln, newHealthHandler(ref, newRegistry(ref), log), log)
	})
	g.Go(func() error {
		a, err := newAgent(ctx, cfg, log, getenv)
		if err != nil {
			return err
		}
		ref.set(a)
		log.Info("starting", "version", agentVersion(), "hub", cfg.HubURL, "identity", cfg.Identity,
			"tenant", cfg.Tenant, "cluster", cfg.Cluster, "credentialSecret", cfg.Namespace+"/"+cfg.CredentialSecret,
			"enrollmentToken", cfg.EnrollmentToken != "", "listen", ln.Addr().String(), "dispatch", cfg.Dispatch,
			"allowedRegistries", cfg.Images.Registries(), "requiredDigests", len(cfg.Images.RequiredDigests))
		return a.Run(ctx)
	})
	return g.Wait()
}

// newAgent connects to the worker's API server and builds the agent.
func newAgent(ctx context.Context, cfg *config, log *slog.Logger, getenv func(string) string) (*agent.Agent, error) {
	restCfg, err := restConfig(cfg.Kubeconfig, getenv)
	if err != nil {
		return nil, err
	}
	restCfg.UserAgent = "flotilla-agent/" + agentVersion()
	// An apply costs a few requests per object (read, dry-run, apply, read back) and a
	// list per kind to prune; client-go's default of 5 per second would stretch one apply
	// of a preset over many seconds.
	restCfg.QPS, restCfg.Burst = 20, 50

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	if err := kueue.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	// The RESTMapper is client.New's default, dynamic one: it learns of a Kueue CRD
	// installed after the agent started.
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the worker's API server %s: %w", restCfg.Host, err)
	}
	kv, err := kubernetesVersion(ctx, restCfg, log)
	if err != nil {
		return nil, err
	}

	applier, err := apply.New(apply.Options{Client: c, Identity: cfg.Identity, FieldManager: agent.FieldManager, Log: log})
	if err != nil {
		return nil, err
	}
	installer, without, err := newInstaller(cfg, restCfg, log)
	if err != nil {
		return nil, err
	}
	converger, err := converge.New(converge.Options{Client: c, Applier: applier, Installer: installer, WithoutInstaller: without, Images: cfg.Images, ProbeNamespace: cfg.Namespace, Log: log})
	if err != nil {
		return nil, err
	}
	inv, err := inventory.NewCollector(inventory.Options{Client: c, DCGMURL: cfg.DCGMURL})
	if err != nil {
		return nil, err
	}
	// The hub's MultiKueue reaches this worker's API server through the agent, under
	// the chart's flotilla-dispatch ServiceAccount, which the agent impersonates.
	var dispatch *proxy.Handler
	if cfg.Dispatch {
		h, err := proxy.New(proxy.Options{Config: restCfg, Namespace: cfg.Namespace, Namespaces: cfg.DispatchNamespaces, ClusterRole: cfg.DispatchClusterRole, Log: log})
		if err != nil {
			return nil, err
		}
		dispatch = h
	}
	var tlsCfg *tls.Config
	if cfg.RootCAs != nil {
		tlsCfg = &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
	}
	return agent.New(agent.Options{
		HubURL:            cfg.HubURL,
		Identity:          cfg.Identity,
		EnrollmentToken:   cfg.EnrollmentToken,
		CredentialSecret:  types.NamespacedName{Namespace: cfg.Namespace, Name: cfg.CredentialSecret},
		Client:            c,
		TLS:               tlsCfg,
		Liveness:          cfg.Liveness,
		Applier:           converger,
		Inventory:         inv,
		Proxy:             dispatch,
		AgentVersion:      agentVersion(),
		KubernetesVersion: kv,
		Log:               log,
	})
}

// newInstaller is the installer of Kueue and JobSet, acting as the chart's ServiceAccount
// for it when one is configured. Without one, it says why, for the status of a cluster
// whose components flotilla manages.
func newInstaller(cfg *config, restCfg *rest.Config, log *slog.Logger) (converge.Installer, string, error) {
	if !cfg.InstallComponents {
		return nil, "the agent was installed with components.install: false, without the permissions to install Kueue and JobSet: set spec.components.managed: false in cluster.yaml if the cluster's team runs them, or install the agent's chart with components.install: true", nil
	}
	bin := cfg.ComponentsBinary
	if bin == "" {
		var err error
		if bin, err = components.BesideExecutable(); err != nil {
			return nil, "", err
		}
	}
	if _, err := os.Stat(bin); err != nil {
		log.Warn("the installer of Kueue and JobSet is missing: clusters whose components flotilla manages are reported as such", "path", bin, "error", err)
		return nil, "the agent's installer of Kueue and JobSet (" + components.BinaryName + ") is missing from its image: reinstall the agent's chart with its own image", nil
	}
	icfg := rest.CopyConfig(restCfg)
	if cfg.ComponentsServiceAccount != "" {
		icfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ComponentsServiceAccount}
	}
	kc, err := components.KubeConfigFor(icfg)
	if err != nil {
		return nil, "", err
	}
	return &components.Installer{Binary: bin, KubeConfig: kc, Stderr: os.Stderr, Images: cfg.Images}, "", nil
}

// restConfig is the worker's API server: the kubeconfig given, else the pod's service
// account, else $KUBECONFIG. Nothing else is looked at: an agent that quietly picked up
// someone's ~/.kube/config would apply to whatever cluster that names.
func restConfig(kubeconfig string, getenv func(string) string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := workerconfig.InClusterOrEnv(getenv)
	if errors.Is(err, workerconfig.ErrNowhere) {
		return nil, errors.New("not running in a cluster: pass --kubeconfig or set " + kubeconfigEnv)
	}
	return cfg, err
}

// kubernetesVersion reads the worker's version for the hello, retrying for a while: an
// agent started with its node may find the API server not yet reachable.
func kubernetesVersion(ctx context.Context, cfg *rest.Config, log *slog.Logger) (string, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("connecting to the worker's API server %s: %w", cfg.Host, err)
	}
	var gitVersion string
	var last error
	b := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: 6, Cap: 30 * time.Second}
	err = wait.ExponentialBackoffWithContext(ctx, b, func(ctx context.Context) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		info, err := dc.ServerVersionWithContext(rctx)
		if err != nil {
			last = err
			log.Warn("reading the worker's Kubernetes version", "server", cfg.Host, "error", err)
			return false, nil
		}
		gitVersion = info.GitVersion
		return true, nil
	})
	if err != nil {
		if last != nil && ctx.Err() == nil {
			err = last
		}
		return "", fmt.Errorf("reading the Kubernetes version of %s: %w", cfg.Host, err)
	}
	return gitVersion, nil
}

// agentVersion is the bare version the agent announces to the hub: version.Version when
// set at build time, else the module version Go recorded.
func agentVersion() string {
	if version.Version != "" {
		return version.Version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}
