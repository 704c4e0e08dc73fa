package kueuetest

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	configv1alpha1 "k8s.io/component-base/config/v1alpha1"
	"k8s.io/utils/ptr"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	"sigs.k8s.io/yaml"
)

// loopback is where every server of the manager listens: test traffic stays on this machine.
const loopback = "127.0.0.1"

// visibilityGate is Kueue's feature gate for its on-demand visibility API server.
const visibilityGate = "VisibilityOnDemand"

// settings are the caller's choices that configure respects.
type settings struct {
	// leaderElection keeps the configuration's leader election.
	leaderElection bool
	// flagGates are the feature gates of a --feature-gates argument, nil when there is none:
	// Kueue then ignores (and refuses) the configuration's.
	flagGates map[string]bool
}

// configure returns a copy of the caller's configuration (nil is Kueue's defaults) with the
// harness's parts filled in: namespace, the servers on the given free loopback ports (health,
// webhook, visibility), no metrics server, the webhook certificate directory, no leader election
// (unless kept, then with its lease in the namespace) and no internal certificate management.
func configure(in *configapi.Configuration, ports []int, certDir string, set settings) *configapi.Configuration {
	cfg := &configapi.Configuration{}
	if in != nil {
		cfg = in.DeepCopy()
	}
	cfg.APIVersion = configapi.GroupVersion.String()
	cfg.Kind = "Configuration"
	if ptr.Deref(cfg.Namespace, "") == "" {
		cfg.Namespace = ptr.To(Namespace)
	}
	addr := func(port int) string { return net.JoinHostPort(loopback, strconv.Itoa(port)) }
	cfg.Health.HealthProbeBindAddress = addr(ports[0])
	// No metrics server ("0"): it binds its port after the manager reports ready, so a port
	// taken meanwhile by another process of this machine stopped a manager a test was
	// using, where a port taken during the start is chosen again (Start). No test reads
	// Kueue's metrics.
	cfg.Metrics.BindAddress = "0"
	cfg.Webhook = configapi.ControllerWebhook{Host: loopback, Port: ptr.To(ports[1]), CertDir: certDir}
	switch {
	case !set.leaderElection || cfg.LeaderElection == nil || !ptr.Deref(cfg.LeaderElection.LeaderElect, false):
		// One manager per plane needs no lease: it leads at once.
		cfg.LeaderElection = &configv1alpha1.LeaderElectionConfiguration{LeaderElect: ptr.To(false)}
	case cfg.LeaderElection.ResourceNamespace == "":
		// In a pod, controller-runtime finds the lease's namespace in the service account's
		// files; a process here has none.
		cfg.LeaderElection.ResourceNamespace = *cfg.Namespace
	}
	// The webhook certificate comes from the harness, whose CA the webhook configurations carry;
	// Kueue's own rotation would write a Secret and patch configurations for a Service.
	cfg.InternalCertManagement = &configapi.InternalCertManagement{Enable: ptr.To(false)}
	// The visibility server binds port 8082 on every interface by default, which two managers
	// on one machine cannot share, and needs an APIService registration the tests do not make.
	// With gates on the command line, managerArgs has turned it off there.
	visibility := set.flagGates[visibilityGate]
	if set.flagGates == nil {
		if _, set := cfg.FeatureGates[visibilityGate]; !set {
			if cfg.FeatureGates == nil {
				cfg.FeatureGates = map[string]bool{}
			}
			cfg.FeatureGates[visibilityGate] = false
		}
		visibility = cfg.FeatureGates[visibilityGate]
	}
	if visibility {
		cfg.VisibilityServer = &configapi.VisibilityServerConfiguration{BindAddress: ptr.To(loopback), BindPort: ptr.To(int32(ports[2]))}
	}
	return cfg
}

// ownedFlags are the manager's flags that the harness sets itself: the files it writes and the
// ports it chooses.
var ownedFlags = []string{"config", "kubeconfig", "visibility-server-port"}

// managerArgs returns the caller's arguments without the flags the harness owns, with the
// VisibilityOnDemand gate turned off in a --feature-gates argument that does not name it, and the
// gates that argument sets (nil when there is none). Kueue reads gates from the flag or from
// the configuration, never both.
func managerArgs(in []string) (args []string, gates map[string]bool, err error) {
	for _, arg := range in {
		name, value, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		switch {
		case !strings.HasPrefix(arg, "-"):
			args = append(args, arg)
		case slices.Contains(ownedFlags, name):
			if !strings.Contains(arg, "=") {
				return nil, nil, fmt.Errorf("argument %q: give the harness's flags as --name=value", arg)
			}
		case name == "feature-gates":
			gates = map[string]bool{}
			for kv := range strings.SplitSeq(value, ",") {
				if kv = strings.TrimSpace(kv); kv == "" {
					continue
				}
				k, v, ok := strings.Cut(kv, "=")
				on, perr := strconv.ParseBool(strings.TrimSpace(v))
				if !ok || perr != nil {
					return nil, nil, fmt.Errorf("argument %q: feature gate %q is not name=true|false", arg, kv)
				}
				gates[strings.TrimSpace(k)] = on
			}
			if _, ok := gates[visibilityGate]; !ok {
				gates[visibilityGate] = false
				value = strings.TrimSuffix(value, ",") + "," + visibilityGate + "=false"
				value = strings.TrimPrefix(value, ",")
			}
			args = append(args, "--feature-gates="+value)
		default:
			args = append(args, arg)
		}
	}
	return args, gates, nil
}

// frameworks returns the integrations Kueue enables with cfg: its defaulting decides when the
// configuration names none, and some integrations imply others.
func frameworks(cfg *configapi.Configuration) []string {
	defaulted := cfg.DeepCopy()
	configapi.SetDefaults_Configuration(defaulted)
	var out []string
	for _, name := range defaulted.Integrations.Frameworks {
		out = append(out, name)
		out = append(out, impliedFrameworks(name)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// impliedFrameworks returns the integrations that Kueue v0.17 enables along with name
// (ImplicitlyEnabledFrameworkNames in pkg/controller/jobs): workloads of these kinds are managed
// through their pods.
func impliedFrameworks(name string) []string {
	switch name {
	case "deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset":
		return []string{"pod"}
	}
	return nil
}

// writeConfig writes cfg as the YAML file Kueue's --config flag reads.
func writeConfig(path string, cfg *configapi.Configuration) error {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encoding the manager's configuration: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing the manager's configuration: %w", err)
	}
	return nil
}
