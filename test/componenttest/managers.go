package componenttest

import (
	"github.com/flotilla-gitops/flotilla/agent/components"

	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
)

// Component is a component whose chart's Deployment the Kubelet plays.
type Component = components.Component

const (
	Kueue  = components.Kueue
	JobSet = components.JobSet
)

// DefaultDeployments are the controller Deployments of the charts as they render for the
// releases the agent installs (kueue in kueue-system, jobset in jobset-system): the Kueue chart
// names it <fullname>-controller-manager, the JobSet chart <fullname>-controller.
func DefaultDeployments() map[Component]types.NamespacedName {
	return map[Component]types.NamespacedName{
		Kueue:  {Namespace: "kueue-system", Name: "kueue-controller-manager"},
		JobSet: {Namespace: "jobset-system", Name: "jobset-controller"},
	}
}

// instance is one running manager process: what the Kubelet needs of it, whichever component.
type instance struct {
	spec    *podSpec
	pid     int
	addr    string // the webhook server's host:port
	ca      []byte // the CA its serving certificate is signed by
	started time.Time
	done    <-chan struct{}
	stop    func() error
}

// exited reports whether the process has ended.
func (in *instance) exited() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// startParams is what every manager start gets besides the pod's spec.
type startParams struct {
	plane      *controlplane.ControlPlane
	kubeconfig []byte
	output     io.Writer
	log        *slog.Logger
	timeout    time.Duration
}

// startManager runs the real manager of c for spec and returns once it reports ready.
func startManager(ctx context.Context, c Component, spec *podSpec, p startParams) (*instance, error) {
	switch c {
	case Kueue:
		return startKueue(ctx, spec, p)
	case JobSet:
		return startJobSet(ctx, spec, p)
	}
	return nil, fmt.Errorf("no manager for component %q", c)
}

// kueueOwnedFlags are Kueue's flags that name files or bind ports: the harness sets them.
var kueueOwnedFlags = []string{"config", "kubeconfig", "visibility-server-port"}

// startKueue runs Kueue's manager through test/kueuetest with the chart's configuration, the
// webhooks left to the Kubelet and the chart's leader election kept.
func startKueue(ctx context.Context, spec *podSpec, p startParams) (*instance, error) {
	cfg := &configapi.Configuration{}
	if spec.config != nil {
		if err := decodeConfig(spec.config, configapi.GroupVersion.String(), cfg); err != nil {
			return nil, fmt.Errorf("kueue's configuration %s: %w", spec.configPath, err)
		}
	}
	m, err := kueuetest.Start(ctx, p.plane, kueuetest.Options{
		Config:         cfg,
		Output:         p.output,
		Log:            p.log,
		StartTimeout:   p.timeout,
		Webhooks:       kueuetest.WebhooksExternal,
		Args:           trimArgs(spec.args, kueueOwnedFlags...),
		KubeConfig:     p.kubeconfig,
		LeaderElection: true,
	})
	if err != nil {
		return nil, err
	}
	return &instance{spec: spec, pid: m.Pid(), addr: m.WebhookAddr, ca: m.CABundle, started: time.Now(), done: m.Done(), stop: m.Stop}, nil
}

// decodeConfig decodes a manager's configuration file strictly, as the manager does: a field it
// does not know fails the start, as it would fail the pod.
func decodeConfig(data []byte, apiVersion string, into any) error {
	var meta struct {
		APIVersion string `json:"apiVersion"`
	}
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return err
	}
	if meta.APIVersion != apiVersion {
		return fmt.Errorf("apiVersion %q, the harness reads %s", meta.APIVersion, apiVersion)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		return err
	}
	return nil
}

// trimArgs drops the flags named in owned (as --name=value or --name value) from args.
func trimArgs(args []string, owned ...string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && slices.Contains(owned, name) {
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
			}
			continue
		}
		out = append(out, a)
	}
	return out
}
