package converge

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// Applier applies a desired state's objects (agent/apply).
type Applier interface {
	Apply(ctx context.Context, state protocol.DesiredState) protocol.Applied
}

// Installer installs and upgrades components (components.Installer runs the binary).
type Installer interface {
	Apply(ctx context.Context, spec components.Spec) (components.Report, error)
}

// Options configure a Converger.
type Options struct {
	// Client reads the worker: readiness probes, ClusterQueues, and for unmanaged
	// components their Deployments.
	Client client.Client
	// Applier applies the desired objects.
	Applier Applier
	// Installer installs managed components; nil reports every managed component as
	// failed, with WithoutInstaller as the reason.
	Installer        Installer
	WithoutInstaller string
	// Images is the worker's policy on the images the installer may run; the zero value
	// allows registry.k8s.io alone.
	Images components.ImagePolicy
	// ReadyTimeout bounds the wait for components to answer within one apply; past it
	// the report says what is awaited and the agent tries again later. Default 2 minutes.
	ReadyTimeout time.Duration
	// PollInterval is how often readiness is probed while waiting. Default 1 second.
	PollInterval time.Duration
	// ProbeNamespace is where JobSet's webhook is probed with a dry-run JobSet: the
	// agent's namespace.
	ProbeNamespace string
	Log            *slog.Logger
}

// Converger is an Applier that brings components about first. Safe for concurrent use;
// applies are serialized.
type Converger struct {
	opts Options

	mu sync.Mutex
	// converged is the key of the last Spec installed and found ready: the same Spec
	// again is neither held nor reinstalled.
	converged string
}

// New checks the options.
func New(opts Options) (*Converger, error) {
	if opts.Client == nil || opts.Applier == nil {
		return nil, errors.New("converge: a client and an applier are required")
	}
	if opts.ProbeNamespace == "" {
		return nil, errors.New("converge: a namespace for readiness probes is required")
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 2 * time.Minute
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Converger{opts: opts}, nil
}

// Apply brings the components of state about, then applies its objects.
func (c *Converger) Apply(ctx context.Context, state protocol.DesiredState) protocol.Applied {
	c.mu.Lock()
	defer c.mu.Unlock()
	if state.Components == nil || state.Decommission {
		return c.opts.Applier.Apply(ctx, state)
	}
	spec := *state.Components
	if !spec.Managed {
		res := c.opts.Applier.Apply(ctx, state)
		res.Components = c.checkVersions(ctx, spec)
		return res
	}
	// Without an installer nothing is installed anyway, and that is what to fix first.
	if refused := c.opts.Images.Refused(spec); refused != nil && c.opts.Installer != nil {
		// Before the hold: a state the worker refuses changes nothing on it, not even its
		// ClusterQueues for a moment, and its objects, which need the components, wait.
		c.opts.Log.Warn("the desired state names images this worker does not allow; nothing is installed or applied",
			"generation", state.Generation, "hash", state.Hash, "reason", refused[0].Reason, "message", refused[0].Message)
		return protocol.Applied{Generation: state.Generation, Hash: state.Hash, Results: []protocol.ObjectResult{}, Components: refused}
	}
	key := specKey(spec)
	statuses := make([]components.Status, 0, 2)
	if key != c.converged {
		// Without an installer nothing will change: nothing to hold.
		held := c.opts.Installer != nil && c.hold(ctx, state)
		rep, err := c.install(ctx, spec)
		if err == nil {
			statuses = rep.Components
		} else {
			for _, comp := range components.All() {
				statuses = append(statuses, components.Status{Component: comp, Version: spec.Release(comp).Version, Action: components.ActionFailed, Message: err.Error()})
			}
		}
		if blocked(statuses) {
			// A Kueue that is not flotilla's is in the way, or the install failed: the
			// hold is taken back, so that a cluster flotilla does not (yet) manage keeps
			// admitting work as before.
			out := protocol.Applied{Generation: state.Generation, Hash: state.Hash, Results: []protocol.ObjectResult{}}
			if held {
				out = c.opts.Applier.Apply(ctx, state)
			}
			out.Components = notReady(statuses)
			return out
		}
	} else {
		for _, comp := range components.All() {
			statuses = append(statuses, components.Status{Component: comp, Version: spec.Release(comp).Version, Action: components.ActionUnchanged})
		}
	}

	// The webhooks first: until they answer, Kueue's objects cannot even be written.
	if waits := c.waitFor(ctx, func(ctx context.Context) map[components.Component]string { return c.webhooksAnswer(ctx, spec) }); len(waits) > 0 {
		return protocol.Applied{Generation: state.Generation, Hash: state.Hash, Results: []protocol.ObjectResult{}, Components: judged(statuses, waits)}
	}
	res := c.opts.Applier.Apply(ctx, state)
	if !res.Complete() {
		res.Components = judged(statuses, nil)
		return res
	}
	queues := clusterQueues(state)
	waits := c.waitFor(ctx, func(ctx context.Context) map[components.Component]string { return c.queuesJudged(ctx, spec, queues) })
	res.Components = judged(statuses, waits)
	if len(waits) == 0 {
		c.converged = key
	}
	return res
}

// specKey identifies what an install of spec does.
func specKey(spec components.Spec) string {
	b, _ := json.Marshal(spec)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (c *Converger) install(ctx context.Context, spec components.Spec) (components.Report, error) {
	if c.opts.Installer == nil {
		return components.Report{}, errors.New(cmp.Or(c.opts.WithoutInstaller, "the agent runs without an installer of Kueue and JobSet"))
	}
	start := time.Now()
	rep, err := c.opts.Installer.Apply(ctx, spec)
	if err != nil {
		c.opts.Log.Error("installing components", "error", err)
		return rep, err
	}
	for _, s := range rep.Components {
		c.opts.Log.Info("component", "component", s.Component, "version", s.Version, "action", s.Action, "message", s.Message, "took", time.Since(start).Round(time.Millisecond))
	}
	return rep, nil
}

// blocked reports whether a component was refused or failed: nothing more is done.
func blocked(statuses []components.Status) bool {
	return slices.ContainsFunc(statuses, func(s components.Status) bool {
		return s.Action == components.ActionRefused || s.Action == components.ActionFailed
	})
}

func notReady(statuses []components.Status) []components.Status {
	for i := range statuses {
		statuses[i].Ready = false
	}
	return statuses
}

// judged marks each component ready unless waits says what it waits for.
func judged(statuses []components.Status, waits map[components.Component]string) []components.Status {
	for i := range statuses {
		msg, waiting := waits[statuses[i].Component]
		statuses[i].Ready = !waiting
		if waiting {
			statuses[i].Message = "waiting for " + msg
		}
	}
	return statuses
}

// waitFor polls check until it finds nothing to wait for, ctx ends or ReadyTimeout
// passes; it returns what was still awaited, by component.
func (c *Converger) waitFor(ctx context.Context, check func(context.Context) map[components.Component]string) map[components.Component]string {
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(c.opts.PollInterval)
	defer tick.Stop()
	for {
		waits := check(ctx)
		if len(waits) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return waits
		case <-tick.C:
		}
	}
}

var (
	clusterQueueGVK = schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueue"}
	flavorGVK       = schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ResourceFlavor"}
	jobSetGVK       = schema.GroupVersionKind{Group: "jobset.x-k8s.io", Version: "v1alpha2", Kind: "JobSet"}
)

// probeName is the name of the objects the readiness probes create with a dry run:
// nothing is ever stored under it.
const probeName = "flotilla-readiness-probe"

// webhooksAnswer creates a ResourceFlavor and a JobSet with a server-side dry run: the
// API server calls the components' webhooks for each, and fails the request when one
// does not answer. A webhook that answers by refusing the probe answers all the same.
func (c *Converger) webhooksAnswer(ctx context.Context, spec components.Spec) map[components.Component]string {
	waits := map[components.Component]string{}
	kueueWaits := c.probe(ctx, spec, components.Kueue, probeObject(flavorGVK, "", nil))
	if kueueWaits != "" {
		waits[components.Kueue] = kueueWaits
		// Kueue's webhooks see JobSets too: JobSet's own cannot be told apart until
		// Kueue's answer.
		waits[components.JobSet] = fmt.Sprintf("kueue %s to answer first, since its webhooks see JobSets too", spec.Kueue.Version)
		return waits
	}
	if msg := c.probe(ctx, spec, components.JobSet, probeJobSet(c.opts.ProbeNamespace)); msg != "" {
		waits[components.JobSet] = msg
	}
	return waits
}

// probeTimeout bounds one probe: an API server waits up to a webhook's timeoutSeconds
// (10 s in both charts) for a webhook whose Service it cannot reach.
const probeTimeout = 5 * time.Second

// probe creates obj with a dry run and says what comp is awaited for, or "" when the
// component's webhooks answered.
func (c *Converger) probe(ctx context.Context, spec components.Spec, comp components.Component, obj *unstructured.Unstructured) string {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	err := c.opts.Client.Create(ctx, obj, client.DryRunAll)
	if err == nil || apierrors.IsAlreadyExists(err) || deniedByWebhook(err) {
		return ""
	}
	what := fmt.Sprintf("%s %s to answer: ", comp, spec.Release(comp).Version)
	switch {
	case meta.IsNoMatchError(err):
		return what + "its API is not served yet"
	case strings.Contains(err.Error(), "failed calling webhook"):
		return what + "its webhook does not answer (" + err.Error() + ")"
	case ctx.Err() != nil:
		return what + fmt.Sprintf("a dry-run create of %s %s got no answer within %v", obj.GetKind(), obj.GetName(), probeTimeout)
	}
	return what + err.Error()
}

// deniedByWebhook: the webhook answered, and refused.
func deniedByWebhook(err error) bool {
	return strings.Contains(err.Error(), "admission webhook") && strings.Contains(err.Error(), "denied the request")
}

func probeObject(gvk schema.GroupVersionKind, namespace string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(gvk)
	u.SetName(probeName)
	u.SetNamespace(namespace)
	if spec != nil {
		u.Object["spec"] = spec
	}
	return u
}

// probeJobSet is the smallest JobSet JobSet's webhooks accept.
func probeJobSet(namespace string) *unstructured.Unstructured {
	return probeObject(jobSetGVK, namespace, map[string]any{
		"replicatedJobs": []any{map[string]any{
			"name": "probe", "replicas": int64(1),
			"template": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
				"restartPolicy": "Never",
				"containers":    []any{map[string]any{"name": "probe", "image": "probe"}},
			}}}},
		}},
	})
}

// clusterQueues are the names of the ClusterQueues state applies.
func clusterQueues(state protocol.DesiredState) []string {
	var names []string
	for _, raw := range state.Objects {
		var m metav1.PartialObjectMetadata
		if json.Unmarshal(raw, &m) == nil && m.Kind == clusterQueueGVK.Kind && strings.HasPrefix(m.APIVersion, clusterQueueGVK.Group+"/") {
			names = append(names, m.Name)
		}
	}
	return names
}

// queuesJudged: Kueue has judged every ClusterQueue at its current generation, Active,
// or stopped when the desired state holds it (a cordoned cluster).
func (c *Converger) queuesJudged(ctx context.Context, spec components.Spec, names []string) map[components.Component]string {
	if msg, ok := c.queuesActive(ctx, spec, names); !ok {
		return map[components.Component]string{components.Kueue: msg}
	}
	return nil
}

func (c *Converger) queuesActive(ctx context.Context, spec components.Spec, names []string) (string, bool) {
	for _, name := range names {
		cq := &unstructured.Unstructured{}
		cq.SetGroupVersionKind(clusterQueueGVK)
		if err := c.opts.Client.Get(ctx, client.ObjectKey{Name: name}, cq); err != nil {
			return fmt.Sprintf("kueue %s to report ClusterQueue %s Active: %v", spec.Kueue.Version, name, err), false
		}
		conds, _, _ := unstructured.NestedSlice(cq.Object, "status", "conditions")
		var active *metav1.Condition
		for _, raw := range conds {
			m, ok := raw.(map[string]any)
			if !ok || m["type"] != "Active" {
				continue
			}
			active = &metav1.Condition{}
			active.Status = metav1.ConditionStatus(fmt.Sprint(m["status"]))
			active.Reason, _ = m["reason"].(string)
			active.Message, _ = m["message"].(string)
			og, _, _ := unstructured.NestedInt64(m, "observedGeneration")
			active.ObservedGeneration = og
		}
		stop, _, _ := unstructured.NestedString(cq.Object, "spec", "stopPolicy")
		held := stop != "" && stop != "None"
		switch {
		case active == nil || active.ObservedGeneration < cq.GetGeneration():
			return fmt.Sprintf("kueue %s to report ClusterQueue %s Active", spec.Kueue.Version, name), false
		case active.Status == metav1.ConditionTrue, held:
		default:
			return fmt.Sprintf("kueue %s to report ClusterQueue %s Active; it is %s: %s", spec.Kueue.Version, name, active.Reason, active.Message), false
		}
	}
	return "", true
}

// hold applies state with every ClusterQueue held, when the worker has ClusterQueues of
// this state already (a fresh worker has nothing to hold). It reports whether it did.
func (c *Converger) hold(ctx context.Context, state protocol.DesiredState) bool {
	names := clusterQueues(state)
	exists := false
	for _, name := range names {
		cq := &metav1.PartialObjectMetadata{}
		cq.SetGroupVersionKind(clusterQueueGVK)
		if err := c.opts.Client.Get(ctx, client.ObjectKey{Name: name}, cq); err == nil {
			exists = true
			break
		}
	}
	if !exists {
		return false
	}
	held := state
	held.Objects = make([]json.RawMessage, len(state.Objects))
	for i, raw := range state.Objects {
		held.Objects[i] = holdQueue(raw)
	}
	res := c.opts.Applier.Apply(ctx, held)
	if !res.Complete() {
		c.opts.Log.Warn("holding the ClusterQueues before changing components", "error", res.Error)
	}
	return true
}

// holdQueue is raw with stopPolicy Hold when it is a ClusterQueue that is not stopped
// more firmly already.
func holdQueue(raw json.RawMessage) json.RawMessage {
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(raw); err != nil || u.GroupVersionKind().GroupKind() != clusterQueueGVK.GroupKind() {
		return raw
	}
	if p, _, _ := unstructured.NestedString(u.Object, "spec", "stopPolicy"); p == "HoldAndDrain" {
		return raw
	}
	if err := unstructured.SetNestedField(u.Object, "Hold", "spec", "stopPolicy"); err != nil {
		return raw
	}
	out, err := u.MarshalJSON()
	if err != nil {
		return raw
	}
	return out
}

// Deployments of the components as their charts and manifests name them, where the
// running version of an unmanaged component is read.
var deployments = map[components.Component]client.ObjectKey{
	components.Kueue:  {Namespace: components.Namespace(components.Kueue), Name: "kueue-controller-manager"},
	components.JobSet: {Namespace: components.Namespace(components.JobSet), Name: "jobset-controller"},
}

// Deployments are the names of the components' controller Deployments that the agent
// reads for their versions where it does not manage them: what its chart lets it read.
func Deployments() []string {
	var names []string
	for _, comp := range components.All() {
		names = append(names, deployments[comp].Name)
	}
	slices.Sort(names)
	return names
}

// checkVersions reads the versions of components the cluster's team runs, from their
// Deployments' images. A difference is reported, never acted on.
func (c *Converger) checkVersions(ctx context.Context, spec components.Spec) []components.Status {
	var out []components.Status
	for _, comp := range components.All() {
		want := spec.Release(comp).Version
		s := components.Status{Component: comp, Version: want, Action: components.ActionChecked, Ready: true}
		key := deployments[comp]
		d := &appsv1.Deployment{}
		switch err := c.opts.Client.Get(ctx, key, d); {
		case err != nil:
			s.Message = fmt.Sprintf("not managed by flotilla; its version could not be read from Deployment %s: %v", key, reason(err))
		default:
			running := imageVersion(d)
			s.Running = running
			if running == want {
				s.Message = "not managed by flotilla; runs " + running + ", the fleet's version"
			} else {
				s.Message = fmt.Sprintf("not managed by flotilla; runs %s, and fleet.yaml names %s", running, want)
			}
		}
		out = append(out, s)
	}
	return out
}

func reason(err error) string {
	if apierrors.IsNotFound(err) {
		return "not found"
	}
	return err.Error()
}

// imageVersion is the tag of the Deployment's manager image.
func imageVersion(d *appsv1.Deployment) string {
	for _, ctr := range d.Spec.Template.Spec.Containers {
		ref, _, _ := strings.Cut(ctr.Image, "@")
		if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
			if ctr.Name == "manager" || len(d.Spec.Template.Spec.Containers) == 1 {
				return ref[i+1:]
			}
		}
	}
	return "an unknown version"
}
