package components

import (
	"fmt"
	"strings"
)

// DefaultRegistry is where the components' release images are published.
const DefaultRegistry = "registry.k8s.io"

// Spec is what a worker's components must be: the hub sends it with each desired state
// (protocol.DesiredState.Components), and the agent hands it to the installer.
type Spec struct {
	// Managed: flotilla installs and upgrades Kueue and JobSet on the worker. When false,
	// the cluster's platform team runs them, and the agent only checks that the running
	// versions are the fleet's.
	Managed bool `json:"managed"`
	// Adopt lets the installer take over, once, a Kueue or JobSet that was installed
	// without flotilla (by hand, or by another Helm release), keeping its objects.
	Adopt bool `json:"adopt,omitempty"`
	// Registry replaces registry.k8s.io in the images' names: a mirror of the release
	// images. The repository path and tag stay the release's. The worker installs from it
	// only when its ImagePolicy allows it.
	Registry string `json:"registry,omitempty"`
	// Kueue and JobSet are the releases the worker runs.
	Kueue  Release `json:"kueue"`
	JobSet Release `json:"jobset"`
	// Frameworks are the integrations the worker's Kueue enables: those of the hub's
	// Kueue, so that every kind MultiKueue watches on the worker exists there.
	Frameworks []string `json:"frameworks,omitempty"`
}

// Release is one component's version, optionally pinned to an image digest.
type Release struct {
	Version string `json:"version"`
	// Digest, when set (sha256:<64 hex>), pins the release image.
	Digest string `json:"digest,omitempty"`
}

// Release is the release of c that s names.
func (s Spec) Release(c Component) Release {
	if c == Kueue {
		return s.Kueue
	}
	return s.JobSet
}

// Repository is the image repository of c's release images under registry ("" for
// registry.k8s.io).
func Repository(c Component, registry string) string {
	if registry == "" {
		registry = DefaultRegistry
	}
	if path := RepositoryPath(c); path != "" {
		return strings.TrimSuffix(registry, "/") + "/" + path
	}
	return ""
}

// RepositoryPath is the path of c's release images under any registry, the same on a
// mirror as on registry.k8s.io.
func RepositoryPath(c Component) string {
	switch c {
	case Kueue:
		return "kueue/kueue"
	case JobSet:
		return "jobset/jobset"
	}
	return ""
}

// Image is the full image reference of c that s asks for.
func (s Spec) Image(c Component) string {
	r := s.Release(c)
	ref := Repository(c, s.Registry) + ":" + r.Version
	if r.Digest != "" {
		ref += "@" + r.Digest
	}
	return ref
}

// ReleaseName is the Helm release that installs c, and Namespace where it lives: the
// names the charts' own documentation uses, so that Kueue's objects are named as
// everywhere else (kueue-controller-manager, kueue-webhook-service, ...).
func ReleaseName(c Component) string { return string(c) }

// Namespace is where c's release and its controller run.
func Namespace(c Component) string { return string(c) + "-system" }

// Action is what the installer did to a component.
type Action string

const (
	ActionInstalled Action = "installed"
	ActionUpgraded  Action = "upgraded"
	ActionUnchanged Action = "unchanged"
	// ActionAdopted: a component installed without flotilla was taken over (Spec.Adopt).
	ActionAdopted Action = "adopted"
	// ActionRefused: nothing was changed, for a reason the worker holds: a component
	// installed without flotilla is in the way, and the cluster did not opt in to
	// adoption; or the desired state names an image the worker's ImagePolicy does not
	// allow (Status.Reason says which rule).
	ActionRefused Action = "refused"
	// ActionChecked: an unmanaged component's running version was read.
	ActionChecked Action = "checked"
	ActionFailed  Action = "failed"
)

// Status is the installer's outcome for one component, and then the agent's judgement of
// its readiness.
type Status struct {
	Component Component `json:"component"`
	Version   string    `json:"version"`
	Action    Action    `json:"action"`
	// Running is, for a component flotilla does not manage, the version found running
	// ("" when it could not be read).
	Running string `json:"running,omitempty"`
	// Ready: the component answers (its webhooks, and for Kueue the worker's ClusterQueues).
	Ready bool `json:"ready"`
	// Message says what was found, what is awaited, or what failed.
	Message string `json:"message,omitempty"`
	// Reason, for a component refused by the worker's ImagePolicy, is the rule that
	// refused it (ReasonRegistryNotAllowed, ReasonDigestNotAllowed), for the hub's
	// conditions to tell it from a component in the way; empty otherwise.
	Reason string `json:"reason,omitempty"`
}

func (s Status) String() string {
	if s.Message == "" {
		return fmt.Sprintf("%s %s: %s", s.Component, s.Version, s.Action)
	}
	return fmt.Sprintf("%s %s: %s", s.Component, s.Version, s.Message)
}

// Request is what the agent writes on the installer's standard input. It carries the
// worker's kubeconfig, when the agent has one, so that no credential is written to a file
// or shows in a process listing; without one the installer runs in-cluster.
type Request struct {
	Spec Spec `json:"spec"`
	// Images is the worker's policy, which the installer checks Spec against again
	// before it writes an image into a chart's values (see package installer).
	Images     ImagePolicy `json:"images,omitzero"`
	KubeConfig []byte      `json:"kubeconfig,omitempty"`
	// DryRun (uninstall only) lists what would be removed and removes nothing.
	DryRun bool `json:"dryRun,omitempty"`
}

// Report is what the installer writes on its standard output.
type Report struct {
	Components []Status `json:"components"`
	// Removed lists, for uninstall, the releases and objects removed (or, on a dry run,
	// that would be), one line each.
	Removed []string `json:"removed,omitempty"`
}
