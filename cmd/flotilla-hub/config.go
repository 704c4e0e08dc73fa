package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/reconciler/hubclient"
)

// Config is the hub's configuration file. Secrets are never written into it: every
// credential is named by a file (a mounted Kubernetes Secret, typically).
type Config struct {
	// Kubeconfig of the hub cluster; empty uses the in-cluster configuration, then
	// KUBECONFIG.
	Kubeconfig string `yaml:"kubeconfig"`
	// KubeAPI bounds the hub's requests to the hub cluster. Every agent's connection,
	// apply report and inventory is a few requests, so a hub of thousands of agents
	// needs far more than client-go's default of 5 per second. A change to every cluster
	// writes each one's status once, so the rate bounds it: at 10,000 clusters it takes
	// 10,000/qps seconds at least. Default 100 per second, bursts of 200; the API
	// server's priority and fairness still protects it. A hub cluster whose API server
	// has the cores for more can be given a higher rate.
	// MaxInFlight bounds the requests under way at once, so that a slow API server
	// slows the hub down rather than refuses it (hubclient); default 64, negative for
	// no bound.
	KubeAPI struct {
		QPS         float32 `yaml:"qps"`
		Burst       int     `yaml:"burst"`
		MaxInFlight int     `yaml:"maxInFlight"`
	} `yaml:"kubeAPI"`
	Listen struct {
		// Tunnel is where agents dial in (wss, or ws on loopback when allowed).
		Tunnel string `yaml:"tunnel"`
		// HTTP serves /healthz, /readyz, /metrics, the webhooks and the plan pages.
		HTTP string `yaml:"http"`
	} `yaml:"listen"`
	// Connections bound what each listener holds open: whoever reaches a listener (any
	// pod that reaches the API proxy's ClusterIP, say) must not hold connections until
	// the hub runs out of file descriptors, the agents' tunnels with it.
	Connections struct {
		// Tunnel: one connection per agent for as long as it runs. The default max,
		// 20,000, admits a fleet of 10,000 clusters twice over, room for agents that
		// redial before the hub has noticed their old connection gone.
		Tunnel ListenerLimits `yaml:"tunnel"`
		// HTTP: probes, scrapes, the forges' webhooks and the plan pages, each a short
		// request. Default max 1,024.
		HTTP ListenerLimits `yaml:"http"`
		// Proxy: the hub's Kueue alone. Its clients of the workers share their
		// connections when they trust one CA, as the kubeconfigs the hub writes do,
		// and carry many watches each over HTTP/2. Default max 1,024.
		Proxy ListenerLimits `yaml:"proxy"`
	} `yaml:"connections"`
	// Pprof serves Go's profiles (net/http/pprof) on a listener of its own, so that an
	// operator can profile a hub in the field. Off unless listen is set, and only on a
	// loopback address (reach it with kubectl port-forward) unless allowRemote says
	// otherwise: a heap profile holds whatever the hub holds, tokens of the moment too.
	Pprof struct {
		Listen      string `yaml:"listen"`
		AllowRemote bool   `yaml:"allowRemote"`
	} `yaml:"pprof"`
	TLS struct {
		CertFile string `yaml:"certFile"`
		KeyFile  string `yaml:"keyFile"`
	} `yaml:"tls"`
	// AllowInsecureLoopback accepts plain ws:// tunnels from loopback addresses.
	AllowInsecureLoopback bool `yaml:"allowInsecureLoopback"`
	// PublicURL is the hub's HTTP address as forges and browsers see it, for the
	// target URLs of plan statuses.
	PublicURL string `yaml:"publicURL"`
	Age       struct {
		IdentityFiles []string `yaml:"identityFiles"`
	} `yaml:"age"`
	// KMS lets enrollment files encrypted to a cloud KMS be decrypted through SOPS.
	KMS       bool `yaml:"kms"`
	Heartbeat struct {
		Interval Duration `yaml:"interval"`
		Timeout  Duration `yaml:"timeout"`
	} `yaml:"heartbeat"`
	// Dispatch makes the hub's Kueue a MultiKueue manager of the workers, reached
	// through the hub's Kubernetes API proxy over their tunnels. Off without listen.
	Dispatch struct {
		// Listen is the API proxy's HTTPS address, e.g. :9443.
		Listen string `yaml:"listen"`
		// URL is the proxy as the hub's Kueue reaches it, https://host:port: the server
		// of the kubeconfigs the hub writes, and the name in the proxy's certificate.
		URL string `yaml:"url"`
		// Namespace holds the proxy's CA Secret. Default flotilla-system.
		Namespace string `yaml:"namespace"`
		// CASecret is the name of that Secret. Default flotilla-hub-proxy-ca.
		CASecret string `yaml:"caSecret"`
		// KueueNamespace is the hub Kueue's namespace. Default kueue-system.
		KueueNamespace string `yaml:"kueueNamespace"`
		// ResumeWindow is how long a watch through the proxy outlives its tunnel's
		// break, waiting for the agent to redial. Default 60s.
		ResumeWindow Duration `yaml:"resumeWindow"`
		// LeaderURL is the API proxy of the leading replica as the other replicas reach
		// it, https://host[:port] (the hub chart's Service that selects the leader
		// label). Set, every replica serves the API proxy and relays to the leader what
		// it holds no tunnel for, so that the watches of Kueue a standby holds outlive
		// the leader (a new leader ends none of them). Empty: only the leader serves it.
		LeaderURL string `yaml:"leaderURL"`
	} `yaml:"dispatch"`
	LeaderElection struct {
		Enabled   bool   `yaml:"enabled"`
		Namespace string `yaml:"namespace"`
		Name      string `yaml:"name"`
		// PodName and PodNamespace are this replica's Pod, from the environment
		// (POD_NAME, POD_NAMESPACE: the downward API), which the leader labels so that
		// the Services of the tunnel, the proxy and the webhooks reach it.
		PodName      string `yaml:"-"`
		PodNamespace string `yaml:"-"`
	} `yaml:"leaderElection"`
	// Plans bound what the pull requests' plans may cost: anyone who can open a pull
	// request makes the hub fetch, validate and render its head.
	Plans struct {
		// Timeout is one plan's deadline. Default 1m.
		Timeout Duration `yaml:"timeout"`
		// Workers is how many plans are computed at once over all sources. Default 2.
		Workers int `yaml:"workers"`
		// MaxRenderedClusters is how many clusters one plan renders in full; the rest
		// are summarized. Default 200.
		MaxRenderedClusters int `yaml:"maxRenderedClusters"`
	} `yaml:"plans"`
	// Heads bounds what the hub reads of any one head, of a branch or a pull request;
	// a head over it fails as a whole, like a broken fleet.yaml, and a cluster directory
	// over its own bounds fails that cluster alone. Zero keeps a default that admits a
	// fleet of 10,000 clusters with room to spare.
	Heads struct {
		// MaxBytes of file content, every path counted (default 64 MiB).
		MaxBytes int64 `yaml:"maxBytes"`
		// MaxFiles is the most files and directories (default 100,000).
		MaxFiles int `yaml:"maxFiles"`
		// MaxDepth is the most elements of a path (default 16).
		MaxDepth int `yaml:"maxDepth"`
		// MaxClusterBytes of file content in one cluster directory (default 4 MiB).
		MaxClusterBytes int64 `yaml:"maxClusterBytes"`
		// MaxClusterFiles is the most files and directories of one cluster directory
		// (default 1,000).
		MaxClusterFiles int `yaml:"maxClusterFiles"`
		// Fetch bounds what one fetch may bring into the hub's memory, before anything
		// of it is read: the branch's head (default 256 MiB, 500,000 objects) and each
		// pull request's head with its history (default 64 MiB, 100,000 objects).
		Fetch struct {
			Branch      FetchLimits `yaml:"branch"`
			PullRequest FetchLimits `yaml:"pullRequest"`
			// OpenPullRequests bounds all open pull requests held at once (default 50
			// and 192 MiB); the newest wait their turn.
			OpenPullRequests struct {
				Max      int   `yaml:"max"`
				MaxBytes int64 `yaml:"maxBytes"`
			} `yaml:"openPullRequests"`
			// Timeout bounds one fetch of a branch: a repository that stops answering
			// mid-transfer fails that sync, and the next tries again (default 5m). A
			// pull request's fetch is bounded by plans.timeout.
			Timeout Duration `yaml:"timeout"`
		} `yaml:"fetch"`
	} `yaml:"heads"`
	// Statuses are defaults for every source's commit statuses.
	Statuses struct {
		// SummaryThreshold is how many clusters a change may touch and still get a
		// commit status per cluster; a change to more gets them only for the clusters
		// that fail, beside the fleet's summary and its page. Zero or unset: 50;
		// negative: never summarize. A source's own setting wins.
		SummaryThreshold int `yaml:"summaryThreshold"`
	} `yaml:"statuses"`
	Sources []SourceConfig `yaml:"sources"`
}

// ListenerLimits bound one listener's connections; zero keeps the default.
type ListenerLimits struct {
	// Max is how many connections the listener holds open at once. One more is
	// accepted and closed at once, and counted in flotilla_hub_connections_refused_total.
	Max int `yaml:"max"`
	// IdleTimeout closes a connection that has carried no request for this long, over
	// HTTP/1.1 and HTTP/2 alike. A request under way is never cut however long it
	// lasts (a watch through the proxy lasts hours), nor is a tunnel once upgraded.
	// Default 2m: longer than the 90 s after which client-go and Go's own clients
	// drop an idle connection, so that they drop it first and never send a request on
	// a connection the hub is closing.
	IdleTimeout Duration `yaml:"idleTimeout"`
}

// The default bounds of the listeners' connections (Config.Connections).
const (
	defaultTunnelConnections = 20_000
	defaultHTTPConnections   = 1_024
	defaultProxyConnections  = 1_024
	defaultIdleTimeout       = 2 * time.Minute
)

// FetchLimits bound one fetch; zero keeps the default.
type FetchLimits struct {
	MaxBytes   int64 `yaml:"maxBytes"`
	MaxObjects int   `yaml:"maxObjects"`
}

// SourceConfig is one fleet repository of one tenant.
type SourceConfig struct {
	// Name identifies the source in logs, metrics and its webhook path
	// (/webhooks/<name>).
	Name   string `yaml:"name"`
	URL    string `yaml:"url"`
	Branch string `yaml:"branch"`
	Tenant string `yaml:"tenant"`
	// Namespace on the hub cluster; defaults to the tenant's name.
	Namespace         string   `yaml:"namespace"`
	Poll              Duration `yaml:"poll"`
	WebhookSecretFile string   `yaml:"webhookSecretFile"`
	Git               struct {
		Username        string `yaml:"username"`
		PasswordFile    string `yaml:"passwordFile"`
		SSHKeyFile      string `yaml:"sshKeyFile"`
		KnownHostsFile  string `yaml:"knownHostsFile"`
		TrustedKeysFile string `yaml:"trustedKeysFile"`
	} `yaml:"git"`
	// Dispatch is what the hub's dispatch gives the source's tenant.
	Dispatch struct {
		// WorkloadNamespaces are the namespaces on the hub cluster that the tenant owns
		// for its jobs. Of the workload namespaces its fleet.yaml names, the hub's
		// dispatch creates (labelled flotilla.dev/tenant=<tenant>) and fills with the
		// LocalQueues of the tenant's dispatch pools only these, so that which tenant
		// submits where is the operator's word, never the first tenant's to sync. A
		// namespace fleet.yaml names that is not listed here gets no LocalQueue, and
		// the fleet's summary says to add it here. No two sources may list one
		// namespace, nor any list kube-*, default, kueue-system, jobset-system, the
		// hub's own namespaces or a source's namespace. Empty: the tenant queues
		// nowhere on the hub.
		WorkloadNamespaces []string `yaml:"workloadNamespaces"`
	} `yaml:"dispatch"`
	Statuses struct {
		// Kind is notes (the default: git notes in the repository), github, gitea,
		// gitlab, or none.
		Kind           string `yaml:"kind"`
		URL            string `yaml:"url"`
		Owner          string `yaml:"owner"`
		Repo           string `yaml:"repo"`
		Project        string `yaml:"project"`
		TokenFile      string `yaml:"tokenFile"`
		AppID          int64  `yaml:"appID"`
		InstallationID int64  `yaml:"installationID"`
		PrivateKeyFile string `yaml:"privateKeyFile"`
		// SummaryThreshold overrides the top-level statuses.summaryThreshold for this
		// source; zero or unset keeps it.
		SummaryThreshold int `yaml:"summaryThreshold"`
	} `yaml:"statuses"`
}

// Duration reads "30s" style durations.
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (like 30s or 5m)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// LoadConfig reads and checks a configuration file; errors name the file and line.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

func (c *Config) check() error {
	if c.Listen.Tunnel == "" {
		c.Listen.Tunnel = ":8443"
	}
	if c.Listen.HTTP == "" {
		c.Listen.HTTP = ":8080"
	}
	if p := c.Pprof; p.Listen != "" && !p.AllowRemote && !loopbackAddress(p.Listen) {
		return fmt.Errorf("pprof.listen: %q is not a loopback address (127.0.0.1:6060, [::1]:6060, localhost:6060); the profiles hold what the hub holds: set pprof.allowRemote to serve them beyond the hub's own machine", p.Listen)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return errors.New("tls: give both certFile and keyFile")
	}
	if c.TLS.CertFile == "" && !c.AllowInsecureLoopback {
		return errors.New("tls: the tunnel needs a certificate (or allowInsecureLoopback for a hub and agents on one machine)")
	}
	if len(c.Age.IdentityFiles) == 0 && !c.KMS {
		return errors.New("age.identityFiles: the hub needs an age identity (or kms) to read enrollment tokens")
	}
	if c.LeaderElection.Enabled && c.LeaderElection.Namespace == "" {
		return errors.New("leaderElection.namespace is required when leader election is enabled")
	}
	if c.LeaderElection.Name == "" {
		c.LeaderElection.Name = "flotilla-hub"
	}
	if d := &c.Dispatch; d.Listen != "" {
		u, err := url.Parse(d.URL)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
			return errors.New("dispatch.url: the proxy's address as the hub's Kueue reaches it, https://host[:port], is required with dispatch.listen")
		}
		if d.Namespace == "" {
			d.Namespace = "flotilla-system"
		}
		if d.CASecret == "" {
			d.CASecret = "flotilla-hub-proxy-ca"
		}
		if d.KueueNamespace == "" {
			d.KueueNamespace = "kueue-system"
		}
		if d.ResumeWindow < 0 {
			return errors.New("dispatch.resumeWindow must not be negative")
		}
		if d.LeaderURL != "" {
			u, err := url.Parse(d.LeaderURL)
			if err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") {
				return errors.New("dispatch.leaderURL: the leading replica's proxy as the other replicas reach it, https://host[:port]")
			}
		}
	}
	for _, l := range []struct {
		name   string
		limits *ListenerLimits
		max    int
	}{
		{"tunnel", &c.Connections.Tunnel, defaultTunnelConnections},
		{"http", &c.Connections.HTTP, defaultHTTPConnections},
		{"proxy", &c.Connections.Proxy, defaultProxyConnections},
	} {
		if l.limits.Max < 0 || l.limits.IdleTimeout < 0 {
			return fmt.Errorf("connections.%s: max and idleTimeout must not be negative", l.name)
		}
		if l.limits.Max == 0 {
			l.limits.Max = l.max
		}
		if l.limits.IdleTimeout == 0 {
			l.limits.IdleTimeout = Duration(defaultIdleTimeout)
		}
	}
	switch {
	case c.KubeAPI.QPS < 0 || c.KubeAPI.Burst < 0:
		return errors.New("kubeAPI: qps and burst must not be negative")
	case c.KubeAPI.QPS == 0:
		c.KubeAPI.QPS = 100
	}
	if c.KubeAPI.Burst == 0 {
		c.KubeAPI.Burst = max(200, int(2*c.KubeAPI.QPS))
	}
	if c.KubeAPI.MaxInFlight == 0 {
		c.KubeAPI.MaxInFlight = hubclient.DefaultMaxInFlight
	}
	if c.Plans.Timeout < 0 || c.Plans.Workers < 0 || c.Plans.MaxRenderedClusters < 0 {
		return errors.New("plans: timeout, workers and maxRenderedClusters must not be negative")
	}
	if c.Heads.MaxBytes < 0 || c.Heads.MaxFiles < 0 || c.Heads.MaxDepth < 0 || c.Heads.MaxClusterBytes < 0 || c.Heads.MaxClusterFiles < 0 {
		return errors.New("heads: maxBytes, maxFiles, maxDepth, maxClusterBytes and maxClusterFiles must not be negative")
	}
	if c.Heads.Fetch.Timeout < 0 {
		return errors.New("heads: fetch: timeout must not be negative")
	}
	for _, l := range []FetchLimits{c.Heads.Fetch.Branch, c.Heads.Fetch.PullRequest} {
		if l.MaxBytes < 0 || l.MaxObjects < 0 {
			return errors.New("heads.fetch: maxBytes and maxObjects must not be negative")
		}
	}
	if o := c.Heads.Fetch.OpenPullRequests; o.Max < 0 || o.MaxBytes < 0 {
		return errors.New("heads.fetch.openPullRequests: max and maxBytes must not be negative")
	}
	if len(c.Sources) == 0 {
		return errors.New("sources: no fleet repository to follow")
	}
	names, namespaces, tenants := map[string]bool{}, map[string]bool{}, map[string]string{}
	for i := range c.Sources {
		s := &c.Sources[i]
		where := fmt.Sprintf("sources[%d]", i)
		switch {
		case s.Name == "" || strings.ContainsAny(s.Name, "/ "):
			return fmt.Errorf("%s.name: a name without slashes or spaces is required", where)
		case names[s.Name]:
			return fmt.Errorf("%s.name: %q is used twice", where, s.Name)
		case s.URL == "":
			return fmt.Errorf("%s.url is required", where)
		case s.Tenant == "":
			return fmt.Errorf("%s.tenant is required", where)
		case len(validation.IsDNS1123Label(s.Tenant)) > 0:
			// It labels the tenant's objects on the hub, names its namespace by default,
			// and is the part before the dot of its dispatch pools' names: a dot or a
			// capital would make those ambiguous or invalid.
			return fmt.Errorf("%s.tenant: %q is not a DNS label (lower-case letters, digits and '-', at most 63 characters)", where, s.Tenant)
		case tenants[s.Tenant] != "":
			// Each source's dispatch prunes the tenant's hub objects that its own fleet
			// does not ask for: two would prune each other's.
			return fmt.Errorf("%s: sources %s and %s both follow tenant %s; give each tenant one source", where, tenants[s.Tenant], s.Name, s.Tenant)
		}
		if u, err := url.Parse(s.URL); err == nil && u.User != nil {
			if _, hasPassword := u.User.Password(); hasPassword {
				return fmt.Errorf("%s.url: credentials in the URL; use git.passwordFile", where)
			}
		}
		if s.Branch == "" {
			s.Branch = "main"
		}
		if s.Namespace == "" {
			s.Namespace = s.Tenant
		}
		if namespaces[s.Namespace] {
			return fmt.Errorf("%s.namespace: %q is written by another source", where, s.Namespace)
		}
		if s.Poll == 0 {
			s.Poll = Duration(time.Minute)
		}
		switch s.Statuses.Kind {
		case "":
			s.Statuses.Kind = "notes"
		case "notes", "github", "gitea", "gitlab", "none":
		default:
			return fmt.Errorf("%s.statuses.kind: %q is none of notes, github, gitea, gitlab, none", where, s.Statuses.Kind)
		}
		names[s.Name], namespaces[s.Namespace], tenants[s.Tenant] = true, true, s.Name
	}
	return c.checkWorkloadNamespaces(namespaces)
}

// checkWorkloadNamespaces refuses a hub workload namespace that is no namespace's name,
// that two sources claim, or that is the hub's, Kubernetes', Kueue's, JobSet's or a
// source's own: whoever submits jobs to a tenant's queues needs to write there.
func (c *Config) checkWorkloadNamespaces(sourceNamespaces map[string]bool) error {
	reserved := map[string]string{"default": "Kubernetes'", "kueue-system": "Kueue's", "jobset-system": "JobSet's"}
	for _, ns := range []string{c.Dispatch.Namespace, c.LeaderElection.Namespace} {
		if ns != "" {
			reserved[ns] = "the hub's"
		}
	}
	if ns := c.Dispatch.KueueNamespace; ns != "" {
		reserved[ns] = "Kueue's"
	}
	owner := map[string]string{}
	for i, s := range c.Sources {
		for j, ns := range s.Dispatch.WorkloadNamespaces {
			where := fmt.Sprintf("sources[%d].dispatch.workloadNamespaces[%d]", i, j)
			switch {
			case len(validation.IsDNS1123Label(ns)) > 0:
				return fmt.Errorf("%s: %q is not a namespace's name (a DNS label)", where, ns)
			case strings.HasPrefix(ns, "kube-"):
				return fmt.Errorf("%s: %s is Kubernetes' own; give the tenant a namespace for its jobs", where, ns)
			case reserved[ns] != "":
				return fmt.Errorf("%s: %s is %s own; give the tenant a namespace for its jobs", where, ns, reserved[ns])
			case sourceNamespaces[ns]:
				return fmt.Errorf("%s: %s is a source's namespace, which holds its WorkerClusters and the agents' credentials; give the tenant a namespace for its jobs", where, ns)
			case owner[ns] == s.Name:
				return fmt.Errorf("%s: %s is listed twice", where, ns)
			case owner[ns] != "":
				return fmt.Errorf("%s: sources %s and %s both claim hub namespace %s; a namespace is one tenant's", where, owner[ns], s.Name, ns)
			}
			owner[ns] = s.Name
		}
	}
	return nil
}

// loopbackAddress reports whether addr, host:port, listens on loopback only.
func loopbackAddress(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// readSecret reads a secret file, trimmed of the newline editors leave.
func readSecret(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}
