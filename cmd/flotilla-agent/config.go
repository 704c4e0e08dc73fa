package main

import (
	"bytes"
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/cmd/internal/workerconfig"
)

// Defaults of the settings that have one.
const (
	defaultNamespace        = "flotilla-system"
	defaultCredentialSecret = "flotilla-agent-credential"
	defaultListen           = ":8080"
	namespaceEnv            = "POD_NAMESPACE"
	kubeconfigEnv           = workerconfig.KubeconfigEnv
)

// defaultHeartbeat is the interval of the agent's pings; the peer is declared dead after
// three intervals of silence, as protocol.DefaultLiveness does.
var defaultHeartbeat = protocol.DefaultLiveness.Interval

// minHeartbeat keeps an operator from making the agent ping the hub in a busy loop.
const minHeartbeat = time.Second

// config is everything the agent runs with, checked.
type config struct {
	HubURL   string
	Tenant   string
	Cluster  string
	Identity string
	// EnrollmentToken is empty when none is configured: an agent that already holds a
	// credential does not need it.
	EnrollmentToken  protocol.Secret
	Namespace        string
	CredentialSecret string
	// RootCAs verify the hub's certificate; nil means the system's roots.
	RootCAs    *x509.CertPool
	Liveness   protocol.Liveness
	DCGMURL    string
	Listen     string
	Kubeconfig string
	LogLevel   slog.Level
	// Dispatch serves the hub's Kubernetes API proxy streams, through which the hub's
	// MultiKueue dispatches jobs to this worker.
	Dispatch bool
	// DispatchNamespaces, when set, are the only workload namespaces the hub's Kueue may
	// reach, whatever the fleet names (agent/proxy.Options.Namespaces).
	DispatchNamespaces []string
	// DispatchClusterRole is the chart's ClusterRole of the dispatch identity's
	// namespaced rules, which the agent binds in the workload namespaces
	// (agent/proxy.Options.ClusterRole).
	DispatchClusterRole string
	// InstallComponents: the agent may install Kueue and JobSet, where the fleet manages
	// them. The chart grants the installer its permissions only when it is true.
	InstallComponents bool
	// ComponentsBinary is the installer of Kueue and JobSet; empty is the one beside the
	// agent's executable.
	ComponentsBinary string
	// ComponentsServiceAccount, in the agent's namespace, is the identity the installer
	// acts as (the agent impersonates it); empty is the agent's own.
	ComponentsServiceAccount string
	// Images are the registries and digests the worker's administrator allows the
	// components' images (components.allowedRegistries, components.requiredDigests).
	Images components.ImagePolicy
}

// flagValues are the command line's settings; changed tells which were given.
type flagValues struct {
	values                string
	hubURL                string
	identity              string
	namespace             string
	credentialSecret      string
	caBundle              string
	heartbeat             time.Duration
	dcgmURL               string
	listen                string
	kubeconfig            string
	tokenFile             string
	logLevel              string
	allowInsecureLoopback bool
	dispatch              bool
	dispatchClusterRole   string
	componentsBinary      string
	componentsSA          string
	installComponents     bool
}

// source is where a setting's value came from, for messages.
type source struct {
	value string
	from  string // "values.yaml:3 (hub.url)", "--hub-url", or "" for a default
	// dir resolves a relative path the value names: the values file's directory for
	// values from the file, the working directory otherwise.
	dir string
}

func (s source) String() string {
	if s.from == "" {
		return "the default"
	}
	return s.from
}

// loadConfig merges the values file, the flags and the environment: a flag that was given
// wins over the values file, which wins over the default. Every problem found is
// reported, not only the first; none of the messages repeats the enrollment token.
func loadConfig(fv flagValues, changed func(flag string) bool, getenv func(string) string) (*config, error) {
	st, err := readSettings(fv.values, changed)
	if err != nil {
		return nil, err
	}
	pick, fail := st.pick, st.fail
	cfg := &config{Kubeconfig: fv.kubeconfig, ComponentsBinary: fv.componentsBinary}

	hub := pick("hub-url", "hub.url", fv.hubURL, "")
	if hub.value == "" {
		st.missing(errors.New("hub.url is required: the hub's wss:// address (set it in the values file or with --hub-url)"))
	} else if u, err := checkHubURL(hub.value, fv.allowInsecureLoopback); err != nil {
		fail(hub, "%v", err)
	} else {
		cfg.HubURL = u
	}

	cfg.Identity = st.identity(fv.identity, "cluster.identity is required: the worker's identity as `flotilla cluster add` printed it (set it in the values file or with --identity)")
	for _, s := range []struct {
		key string
		out *string
	}{{"cluster.tenant", &cfg.Tenant}, {"cluster.name", &cfg.Cluster}} {
		v, ok := st.vals[s.key]
		if !ok {
			continue
		}
		src := source{value: v.value, from: v.where() + " (" + s.key + ")"}
		if msgs := validation.IsDNS1123Label(v.value); len(msgs) > 0 {
			fail(src, "%q is not a DNS label: %s", v.value, strings.Join(msgs, "; "))
			continue
		}
		*s.out = v.value
	}
	cfg.Namespace = st.namespace(fv.namespace, getenv)
	cfg.CredentialSecret = st.credentialSecret(fv.credentialSecret)

	if ca := pick("ca-bundle", "agent.caBundle", fv.caBundle, ""); ca.value != "" {
		pool, err := loadCABundle(ca)
		if err != nil {
			fail(ca, "%v", err)
		}
		cfg.RootCAs = pool
	}

	hb := pick("heartbeat", "agent.heartbeat", fv.heartbeat.String(), defaultHeartbeat.String())
	if d, err := time.ParseDuration(hb.value); err != nil {
		fail(hb, "heartbeat %q is not a duration such as 10s", hb.value)
	} else if d < minHeartbeat {
		fail(hb, "heartbeat %s is shorter than %s", d, minHeartbeat)
	} else {
		cfg.Liveness = protocol.Liveness{Interval: d, Timeout: 3 * d}
	}

	if dcgm := pick("dcgm-url", "agent.dcgmURL", fv.dcgmURL, ""); dcgm.value != "" {
		// The URL itself is never repeated: it may carry credentials.
		if u, err := url.Parse(dcgm.value); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			fail(dcgm, "the DCGM exporter URL is not an absolute http or https URL")
		} else {
			cfg.DCGMURL = dcgm.value
		}
	}

	listen := pick("listen", "agent.listen", fv.listen, defaultListen)
	if _, port, err := net.SplitHostPort(listen.value); err != nil {
		fail(listen, "listen address %q is not host:port: %v", listen.value, err)
	} else if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		fail(listen, "listen address %q has no port number", listen.value)
	}
	cfg.Listen = listen.value

	lvl := pick("log-level", "agent.logLevel", fv.logLevel, "info")
	if err := cfg.LogLevel.UnmarshalText([]byte(lvl.value)); err != nil {
		fail(lvl, "log level %q is not one of debug, info, warn, error", lvl.value)
	}

	// YAML's booleans only: yes, on and 1 are text to YAML, and a setting that reads
	// as true here but as a string to Helm would render the chart differently.
	switch disp := pick("dispatch", "dispatch.enabled", strconv.FormatBool(fv.dispatch), "true"); strings.ToLower(disp.value) {
	case "true":
		cfg.Dispatch = true
	case "false":
	default:
		fail(disp, "dispatch.enabled %q is neither true nor false", disp.value)
	}

	if v, ok := st.vals["dispatch.namespaces"]; ok {
		for _, ns := range v.items {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				fail(source{value: ns, from: v.where() + " (dispatch.namespaces)"}, "%q is not a namespace name: %s", ns, strings.Join(msgs, "; "))
				continue
			}
			cfg.DispatchNamespaces = append(cfg.DispatchNamespaces, ns)
		}
	}
	if role := pick("dispatch-cluster-role", "dispatch.clusterRole", fv.dispatchClusterRole, ""); role.value != "" {
		if msgs := validation.IsDNS1123Subdomain(role.value); len(msgs) > 0 {
			fail(role, "ClusterRole name %q is not valid: %s", role.value, strings.Join(msgs, "; "))
		}
		cfg.DispatchClusterRole = role.value
	}

	switch inst := pick("install-components", "components.install", strconv.FormatBool(fv.installComponents), "true"); strings.ToLower(inst.value) {
	case "true":
		cfg.InstallComponents = true
	case "false":
	default:
		fail(inst, "components.install %q is neither true nor false", inst.value)
	}

	if sa := pick("components-service-account", "components.serviceAccount", fv.componentsSA, ""); sa.value != "" {
		if msgs := validation.IsDNS1123Subdomain(sa.value); len(msgs) > 0 {
			fail(sa, "ServiceAccount name %q is not valid: %s", sa.value, strings.Join(msgs, "; "))
		}
		cfg.ComponentsServiceAccount = sa.value
	}
	cfg.Images = st.images()

	tok, err := enrollmentToken(fv, changed, st.vals)
	if err != nil {
		st.missing(err)
	}
	cfg.EnrollmentToken = tok

	if err := st.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// settings are the values file and the flags of one command, and every problem found in
// them: a flag that was given wins over the values file, which wins over the default.
type settings struct {
	vals    values
	dir     string
	changed func(string) bool
	errs    []error
}

func readSettings(valuesFile string, changed func(string) bool) (*settings, error) {
	st := &settings{vals: values{}, dir: ".", changed: changed}
	if valuesFile != "" {
		data, err := os.ReadFile(valuesFile)
		if err != nil {
			return nil, fmt.Errorf("reading the values file: %w", err)
		}
		if st.vals, err = parseValues(valuesFile, data); err != nil {
			return nil, err
		}
		st.dir = filepath.Dir(valuesFile)
	}
	return st, nil
}

func (st *settings) pick(flag, key, flagValue, def string) source {
	if st.changed(flag) {
		return source{value: flagValue, from: "--" + flag, dir: "."}
	}
	if s, ok := st.vals[key]; ok {
		return source{value: s.value, from: s.where() + " (" + key + ")", dir: st.dir}
	}
	return source{value: def}
}

func (st *settings) fail(s source, format string, args ...any) {
	st.errs = append(st.errs, fmt.Errorf("%s: %s", s, fmt.Sprintf(format, args...)))
}

func (st *settings) missing(err error) { st.errs = append(st.errs, err) }

func (st *settings) err() error { return errors.Join(st.errs...) }

// identity is cluster.identity, which must be given (required says how).
func (st *settings) identity(flagValue, required string) string {
	id := st.pick("identity", "cluster.identity", flagValue, "")
	if id.value == "" {
		st.missing(errors.New(required))
		return ""
	}
	if msgs := validation.IsValidLabelValue(id.value); len(msgs) > 0 {
		st.fail(id, "identity %q is not a label value: %s", id.value, strings.Join(msgs, "; "))
		return ""
	}
	return id.value
}

func (st *settings) namespace(flagValue string, getenv func(string) string) string {
	ns := st.pick("namespace", "agent.namespace", flagValue, cmp.Or(getenv(namespaceEnv), defaultNamespace))
	if msgs := validation.IsDNS1123Label(ns.value); len(msgs) > 0 {
		st.fail(ns, "namespace %q is not a namespace name: %s", ns.value, strings.Join(msgs, "; "))
	}
	return ns.value
}

func (st *settings) credentialSecret(flagValue string) string {
	sec := st.pick("credential-secret", "agent.credentialSecret", flagValue, defaultCredentialSecret)
	if msgs := validation.IsDNS1123Subdomain(sec.value); len(msgs) > 0 {
		st.fail(sec, "credential Secret name %q is not a Secret name: %s", sec.value, strings.Join(msgs, "; "))
	}
	return sec.value
}

// images is the components' image policy of the values file. It has no flags: a list of
// registries and a mapping of digests are the values file's to hold. Registries are kept
// normalized, so that the policy the installer is handed is the one checked here.
func (st *settings) images() components.ImagePolicy {
	var p components.ImagePolicy
	if v, ok := st.vals["components.allowedRegistries"]; ok {
		src := source{from: v.where() + " (components.allowedRegistries)"}
		for _, r := range v.items {
			n, err := components.ParseRegistry(r)
			switch {
			case err != nil:
				st.fail(src, "allowed registry %q %v", r, err)
			case slices.Contains(p.AllowedRegistries, n):
				st.fail(src, "allowed registry %q is listed twice", n)
			default:
				p.AllowedRegistries = append(p.AllowedRegistries, n)
			}
		}
	}
	if v, ok := st.vals["components.requiredDigests"]; ok {
		src := source{from: v.where() + " (components.requiredDigests)"}
		for _, key := range slices.Sorted(maps.Keys(v.entries)) {
			if err := components.CheckRequiredDigest(key, v.entries[key]); err != nil {
				st.fail(src, "%v", err)
				continue
			}
			if p.RequiredDigests == nil {
				p.RequiredDigests = map[string]string{}
			}
			p.RequiredDigests[key] = v.entries[key]
		}
	}
	return p
}

// enrollmentToken reads the token from --enrollment-token-file, else from the values
// file. It has no flag of its own: a flag's value shows in every process listing.
func enrollmentToken(fv flagValues, changed func(string) bool, vals values) (protocol.Secret, error) {
	var tok, from string
	switch s, ok := vals[tokenKey]; {
	case changed("enrollment-token-file"):
		data, err := os.ReadFile(fv.tokenFile)
		if err != nil {
			// The path error names the file, never its content.
			return "", fmt.Errorf("reading the enrollment token: %w", err)
		}
		tok, from = strings.TrimSpace(string(data)), fv.tokenFile
		if tok == "" {
			return "", fmt.Errorf("%s: the enrollment token file is empty", from)
		}
	case ok:
		tok, from = s.value, s.where()+" ("+tokenKey+")"
	default:
		return "", nil
	}
	for _, r := range tok {
		// The token travels in an HTTP header; a token with anything else in it was
		// mangled on its way here.
		if r <= ' ' || r > '~' {
			return "", fmt.Errorf("%s: the enrollment token holds a character a token never has (whitespace, control or non-ASCII); copy it again from the values file `flotilla cluster add` wrote", from)
		}
	}
	return protocol.Secret(tok), nil
}

// checkHubURL applies the hub-URL rule that `flotilla fleet init` applies too, and
// names the agent's switch when it is the one thing missing.
func checkHubURL(raw string, allowInsecureLoopback bool) (string, error) {
	u, err := protocol.CheckHubURL(raw, allowInsecureLoopback)
	if errors.Is(err, protocol.ErrInsecureLoopback) {
		return "", fmt.Errorf("%w: pass --allow-insecure-loopback", err)
	}
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// loadCABundle reads PEM certificates: the value itself when it is PEM (the chart passes
// the bundle inline), else the file it names.
func loadCABundle(s source) (*x509.CertPool, error) {
	pemData := []byte(s.value)
	name := "the inline CA bundle"
	if !bytes.Contains(pemData, []byte("-----BEGIN")) {
		path := s.value
		if !filepath.IsAbs(path) {
			path = filepath.Join(s.dir, path)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading the CA bundle: %w", err)
		}
		pemData, name = data, path
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("%s holds no PEM certificate", name)
	}
	return pool, nil
}
