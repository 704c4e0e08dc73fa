package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitea"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/github"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitlab"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/hub"
	"github.com/flotilla-gitops/flotilla/reconciler/hubcache"
	"github.com/flotilla-gitops/flotilla/reconciler/hubclient"
	"github.com/flotilla-gitops/flotilla/reconciler/leader"
	"github.com/flotilla-gitops/flotilla/reconciler/logbudget"
	"github.com/flotilla-gitops/flotilla/reconciler/plan"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
)

func restConfig(cfg *Config) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = ctrlconfig.GetConfig()
	}
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = cfg.KubeAPI.QPS, cfg.KubeAPI.Burst
	return rc, nil
}

// run serves until ctx ends.
func run(ctx context.Context, cfg *Config, log *slog.Logger) error {
	base, err := restConfig(cfg)
	if err != nil {
		return fmt.Errorf("the hub cluster: %w", err)
	}
	// The Lease is renewed outside the bound on requests in flight: a hub that waits on
	// a slow API server with thousands of status writes must not lose its leadership
	// behind them.
	rc := rest.CopyConfig(base)
	hubclient.LimitInFlight(rc, cfg.KubeAPI.MaxInFlight)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	if err := kueue.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("the hub cluster: %w", err)
	}
	// The tunnel authenticates agents, and /metrics counts clusters, from this cache:
	// neither a refused agent nor a scrape costs the hub cluster's API a request.
	var namespaces []string
	for _, s := range cfg.Sources {
		namespaces = append(namespaces, s.Namespace)
	}
	cached, err := hubcache.Start(ctx, rc, scheme, namespaces)
	if err != nil {
		return fmt.Errorf("the hub cluster: %w", err)
	}
	ids, err := loadIdentities(cfg.Age.IdentityFiles)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	m := newMetrics(reg, cached)
	plans := plan.NewStore(0)
	live := protocol.DefaultLiveness
	if cfg.Heartbeat.Interval > 0 {
		live.Interval = time.Duration(cfg.Heartbeat.Interval)
	}
	if cfg.Heartbeat.Timeout > 0 {
		live.Timeout = time.Duration(cfg.Heartbeat.Timeout)
	}
	// The tunnel and the hub's reconciler both learn facts about the clusters; one
	// writer turns them into the WorkerClusters' status.
	status := conditions.NewWriterWith(c, conditions.WriterOptions{Reader: cached, Log: log})
	tun, err := tunnel.New(tunnel.Options{Client: c, Reader: cached, IdentityIndexed: true, Status: status, Liveness: live, AllowInsecureLoopback: cfg.AllowInsecureLoopback, Log: log})
	if err != nil {
		return err
	}
	var disp *dispatchParts
	var dispatcher hub.Dispatcher
	if cfg.Dispatch.Listen != "" {
		if disp, err = newDispatch(cfg, c, tun, status, m, log); err != nil {
			return err
		}
		dispatcher = disp.dispatcher
	}
	h, err := hub.New(hub.Options{Client: c, Reader: cached, Dispatch: dispatcher, Decryptor: secrets.NewDecryptor(secrets.DecryptorOptions{Identities: ids, KMS: cfg.KMS}), Tunnel: tun, Status: status, Log: log,
		OnSync: m.observeSync, OnFetch: m.observeFetch, OnReconcile: m.observeReconcile,
		Plans: plans, PublicURL: cfg.PublicURL, PlanTimeout: time.Duration(cfg.Plans.Timeout), FetchTimeout: time.Duration(cfg.Heads.Fetch.Timeout), PlanWorkers: cfg.Plans.Workers, MaxPlannedClusters: cfg.Plans.MaxRenderedClusters,
		Budget: fleet.Budget{MaxBytes: cfg.Heads.MaxBytes, MaxFiles: cfg.Heads.MaxFiles, MaxDepth: cfg.Heads.MaxDepth,
			MaxClusterBytes: cfg.Heads.MaxClusterBytes, MaxClusterFiles: cfg.Heads.MaxClusterFiles}})
	if err != nil {
		return err
	}
	m.connected(tun.Sessions)

	mux := http.NewServeMux()
	var sources []*hub.Source
	// Sources that post statuses with one credential share its budget at the forge.
	budgets := map[string]*commitstatus.Budget{}
	// The webhooks of every source share one budget of log lines for refused
	// deliveries: a flood spread over the sources logs no more than one at one.
	webhookRefusals := new(logbudget.Budget)
	for _, sc := range cfg.Sources {
		src, err := addSource(ctx, h, sc, cfg, m, budgets)
		if err != nil {
			return fmt.Errorf("source %s: %w", sc.Name, err)
		}
		sources = append(sources, src)
		if sc.WebhookSecretFile != "" {
			secret, err := readSecret(sc.WebhookSecretFile)
			if err != nil {
				return fmt.Errorf("source %s: webhook secret: %w", sc.Name, err)
			}
			wh := gitsource.NewWebhookHandler(gitsource.WebhookOptions{Secret: []byte(secret), Trigger: func(gitsource.Forge, string) { src.Trigger() },
				Refusals: webhookRefusals, Log: log.With("source", sc.Name)})
			mux.Handle("POST /webhooks/"+sc.Name, m.webhooks(sc.Name, wh))
		}
	}
	// Ready means healthy, leading or not: a rolling update must get its new replica ready
	// while the old one still holds the Lease, and a drain must be able to evict either.
	// The leader's traffic follows the Lease through the leader label instead (package
	// leader).
	var ready atomic.Bool
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle(plan.PathPrefix, plans)
	mux.Handle(hub.CommitsPathPrefix, h.CommitPages())
	conns := cfg.Connections
	httpL, err := listen(ctx, cfg.Listen.HTTP, limitOptions{Name: "http", Max: conns.HTTP.Max, Counts: m.connections("http", conns.HTTP.Max), Log: log})
	if err != nil {
		return fmt.Errorf("the HTTP listener: %w", err)
	}
	httpSrv := httpServer(cfg.Listen.HTTP, mux, conns.HTTP)
	httpErr := make(chan error, 1)
	go func() { httpErr <- httpSrv.Serve(httpL) }()
	defer httpSrv.Close()
	if cfg.Pprof.Listen != "" {
		if err := servePprof(ctx, cfg.Pprof.Listen, log); err != nil {
			return err
		}
	}
	// Counted on every replica, so that the series exist before a replica leads.
	tunnelLimit := limitOptions{Name: "tunnel", Max: conns.Tunnel.Max, Counts: m.connections("tunnel", conns.Tunnel.Max), Log: log}

	// Every replica serves the API proxy when it relays to the leader: a watch of
	// Kueue's held by a standby outlives the leader (tunnel/relay.go). Its failure
	// ends the replica, as the leader's does.
	if disp != nil && disp.everyReplica {
		var fail context.CancelCauseFunc
		ctx, fail = context.WithCancelCause(ctx)
		defer fail(nil)
		go func() {
			if err := disp.serveProxy(ctx, log); err != nil {
				fail(err)
			}
		}()
	}
	var elector *leader.Elector
	if le := cfg.LeaderElection; le.Enabled {
		elector, err = leader.New(leader.Options{Config: base, Namespace: le.Namespace, Name: le.Name, Pod: le.PodName, PodNamespace: le.PodNamespace, Log: log})
		if err != nil {
			return err
		}
	}
	lead := func(ctx context.Context) error {
		tmux := http.NewServeMux()
		tmux.Handle(protocol.Path, tun)
		ts := tunnelServer(cfg.Listen.Tunnel, tmux, conns.Tunnel)
		// A tunnel's websocket, hijacked from the server, still closes through the
		// listener's connection: the bound counts it until the tunnel ends.
		l, err := listen(ctx, cfg.Listen.Tunnel, tunnelLimit)
		if err != nil {
			return fmt.Errorf("the tunnel listener: %w", err)
		}
		tunErr := make(chan error, 1)
		go func() {
			if cfg.TLS.CertFile != "" {
				tunErr <- ts.ServeTLS(l, cfg.TLS.CertFile, cfg.TLS.KeyFile)
				return
			}
			tunErr <- ts.Serve(l)
		}()
		dispErr := make(chan error, 1)
		if disp != nil {
			// A new CA joins every kubeconfig before it signs the proxy's certificate.
			disp.authority.OnTrustChange(func([]byte) { h.WakeDispatch() })
			go func() { dispErr <- disp.serve(ctx, rc, scheme, log) }()
		}
		log.Info("serving", "tunnel", l.Addr().String(), "http", cfg.Listen.HTTP, "sources", len(sources))
		if elector != nil {
			if err := elector.Serving(ctx); err != nil {
				_ = ts.Close()
				return err
			}
		}
		for _, s := range sources {
			go s.Run(ctx)
		}
		select {
		case <-ctx.Done():
		case err := <-tunErr:
			return err
		case err := <-httpErr:
			return err
		case err := <-dispErr:
			if err != nil {
				return err
			}
		}
		_ = ts.Close()
		tun.Close()
		return nil
	}
	ready.Store(true)
	if elector == nil {
		err = lead(ctx)
	} else {
		err = elector.Run(ctx, lead)
	}
	if cause := context.Cause(ctx); err == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

func loadIdentities(files []string) (*secrets.Identities, error) {
	var readers []io.Reader
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("age identity: %w", err)
		}
		readers = append(readers, strings.NewReader(string(data)+"\n"))
	}
	return secrets.ParseIdentities(strings.Join(files, ", "), io.MultiReader(readers...))
}

func addSource(ctx context.Context, h *hub.Hub, sc SourceConfig, cfg *Config, m *metrics, budgets map[string]*commitstatus.Budget) (*hub.Source, error) {
	fetch := cfg.Heads.Fetch
	opts := gitsource.Options{URL: sc.URL, Branch: sc.Branch,
		BranchLimits:      gitsource.Limits{Bytes: fetch.Branch.MaxBytes, Objects: fetch.Branch.MaxObjects},
		PullRequestLimits: gitsource.Limits{Bytes: fetch.PullRequest.MaxBytes, Objects: fetch.PullRequest.MaxObjects},
		MaxPullRequests:   fetch.OpenPullRequests.Max, PullRequestsTotal: fetch.OpenPullRequests.MaxBytes}
	auth, err := gitsource.AuthFromFiles(gitsource.FileAuth{Username: sc.Git.Username, PasswordFile: sc.Git.PasswordFile,
		SSHKeyFile: sc.Git.SSHKeyFile, KnownHostsFile: sc.Git.KnownHostsFile})
	if err != nil {
		return nil, fmt.Errorf("git: %w", err)
	}
	opts.Auth = auth
	if sc.Git.TrustedKeysFile != "" {
		ring, err := os.ReadFile(sc.Git.TrustedKeysFile)
		if err != nil {
			return nil, err
		}
		opts.TrustedKeys = string(ring)
	}
	backend, credential, err := statusBackend(ctx, sc, opts)
	if err != nil {
		return nil, fmt.Errorf("statuses: %w", err)
	}
	var budget *commitstatus.Budget
	if credential != "" {
		if budgets[credential] == nil {
			budgets[credential] = commitstatus.NewBudget()
		}
		budget = budgets[credential]
	}
	// The forge, when it can say, names the open pull requests; closed ones keep
	// their refs forever.
	lister, _ := backend.(commitstatus.PullRequestLister)
	limits, _ := backend.(commitstatus.Limited)
	if backend != nil {
		backend = m.countStatuses(sc.Name, backend)
	}
	threshold := cmp.Or(sc.Statuses.SummaryThreshold, cfg.Statuses.SummaryThreshold)
	src, err := h.AddSource(hub.SourceOptions{Name: sc.Name, Git: opts, Tenant: sc.Tenant, Namespace: sc.Namespace, HubNamespaces: sc.Dispatch.WorkloadNamespaces, Statuses: backend, Limits: limits, Budget: budget,
		SummaryThreshold: threshold, Poll: time.Duration(sc.Poll), PullRequests: lister})
	if err != nil {
		return nil, err
	}
	m.statusQueue(sc.Name, src.StatusQueue)
	return src, nil
}

// apiRoot is a forge's API root as a credential's name holds it: GitHub's default for
// none, the scheme and host in lower case, no trailing slash. Two spellings of one root
// name one credential.
func apiRoot(kind, raw string) string {
	if kind == "github" && raw == "" {
		raw = github.DefaultBaseURL
	}
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Scheme, u.Host = strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	u.Path = strings.TrimRight(u.Path, "/")
	return u.String()
}

// statusBackend is the backend that keeps sc's statuses, and the credential it posts
// with, named so that two sources with the same one share its budget at the forge: the
// kind, the API root and a hash of the token or the GitHub App installation. Empty for
// a backend without a forge's limits.
func statusBackend(ctx context.Context, sc SourceConfig, git gitsource.Options) (commitstatus.Backend, string, error) {
	s := sc.Statuses
	token := func() (string, string, error) {
		if s.TokenFile == "" {
			return "", "", errors.New("tokenFile is required")
		}
		t, err := readSecret(s.TokenFile)
		if err != nil {
			return "", "", err
		}
		sum := sha256.Sum256([]byte(t))
		return t, fmt.Sprintf("%s %s token %x", s.Kind, apiRoot(s.Kind, s.URL), sum), nil
	}
	switch s.Kind {
	case "none":
		return nil, "", nil
	case "notes":
		b, err := gitnotes.New(gitnotes.Options{URL: git.URL, Auth: git.Auth})
		return b, "", err
	case "github":
		opts := github.Options{BaseURL: s.URL, Owner: s.Owner, Repo: s.Repo}
		var credential string
		if s.AppID != 0 {
			key, err := os.ReadFile(s.PrivateKeyFile)
			if err != nil {
				return nil, "", err
			}
			opts.App = &github.App{AppID: s.AppID, InstallationID: s.InstallationID, PrivateKey: key}
			credential = fmt.Sprintf("github %s app %d installation %d", apiRoot(s.Kind, s.URL), s.AppID, s.InstallationID)
		} else {
			t, c, err := token()
			if err != nil {
				return nil, "", err
			}
			opts.Token, credential = t, c
		}
		b, err := github.New(opts)
		return b, credential, err
	case "gitea":
		t, credential, err := token()
		if err != nil {
			return nil, "", err
		}
		b, err := gitea.New(ctx, gitea.Options{URL: s.URL, Owner: s.Owner, Repo: s.Repo, Token: t})
		return b, credential, err
	case "gitlab":
		t, credential, err := token()
		if err != nil {
			return nil, "", err
		}
		b, err := gitlab.New(gitlab.Options{URL: s.URL, Project: s.Project, Token: t})
		return b, credential, err
	}
	return nil, "", fmt.Errorf("unknown kind %q", s.Kind)
}
