package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// DefaultFieldManager is the field manager of the agent's server-side applies.
const DefaultFieldManager = v1alpha1.AgentFieldManager

// RefusePrefix starts the message of every object the agent refuses to adopt.
const RefusePrefix = "refuse to adopt existing object not owned by this WorkerCluster"

// A report lists at most maxListedFailures objects that failed or were refused, and
// clips each of their texts to maxResultText bytes: a desired state of tens of thousands
// of objects that cannot be decoded would otherwise make a report larger than
// protocol.MaxMessageSize, which the tunnel cannot carry, and the agent would lose its
// tunnel over it at every resync. Applied.Error counts them all. The other results name
// only what the API server accepted or holds.
const (
	maxListedFailures = 100
	maxResultText     = 1 << 10
)

// Options configure an Applier.
type Options struct {
	// Client talks to the worker's API server. Its RESTMapper tells which kinds the API
	// server serves, so that a kind without its CRD is skipped when pruning.
	Client client.Client
	// Identity is the worker's identity: the value of flotilla.dev/worker-cluster on
	// everything it owns.
	Identity string
	// OwnerLabel is the label whose value Identity is on what the Applier owns. Default
	// flotilla.dev/worker-cluster; the hub applies its own objects of a tenant under
	// flotilla.dev/tenant, with the same refusal to adopt.
	OwnerLabel string
	// PruneKinds are kinds to prune besides PruneKinds() and the desired state's own.
	PruneKinds []schema.GroupVersionKind
	// PruneNamespaces confines the lists of pruning to one namespace per kind: the hub
	// keeps its Secrets in Kueue's namespace, and listing Secrets in every namespace
	// would need the right to read all of them.
	PruneNamespaces map[schema.GroupKind]string
	// FieldManager names the agent in managedFields; empty means DefaultFieldManager.
	FieldManager string
	// Log receives one line per object that applying changed, refused or failed; nil
	// discards them.
	Log *slog.Logger
}

// Applier applies desired states to one worker cluster. It is safe for concurrent use;
// applies are serialized, since each prunes what the other does not name.
type Applier struct {
	client     client.Client
	fieldOwner string
	identity   string
	ownerLabel string
	extraKinds []schema.GroupVersionKind
	pruneIn    map[schema.GroupKind]string
	log        *slog.Logger

	mu sync.Mutex
}

// New returns an Applier for the worker cluster of opts.Identity.
func New(opts Options) (*Applier, error) {
	if opts.Client == nil {
		return nil, errors.New("apply: a client is required")
	}
	if opts.Client.RESTMapper() == nil {
		return nil, errors.New("apply: the client has no RESTMapper")
	}
	if opts.Identity == "" {
		return nil, errors.New("apply: an identity is required")
	}
	if errs := validation.IsValidLabelValue(opts.Identity); len(errs) > 0 {
		return nil, fmt.Errorf("apply: identity %q is not a label value: %s", opts.Identity, strings.Join(errs, "; "))
	}
	if opts.FieldManager == "" {
		opts.FieldManager = DefaultFieldManager
	}
	if opts.OwnerLabel == "" {
		opts.OwnerLabel = v1alpha1.WorkerClusterLabel
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Applier{
		client:     opts.Client,
		fieldOwner: opts.FieldManager,
		identity:   opts.Identity,
		ownerLabel: opts.OwnerLabel,
		extraKinds: slices.Clone(opts.PruneKinds),
		pruneIn:    maps.Clone(opts.PruneNamespaces),
		log:        log.With("identity", opts.Identity),
	}, nil
}

// objectKey names an object regardless of its API version.
type objectKey struct {
	gk              schema.GroupKind
	namespace, name string
}

func keyOf(gvk schema.GroupVersionKind, namespace, name string) objectKey {
	return objectKey{gk: gvk.GroupKind(), namespace: namespace, name: name}
}

// Apply brings the worker to state: it applies every object and prunes what this
// identity owns and state no longer names, or, for a decommission, prunes everything
// this identity owns. Each object's outcome is in the result; a failed object does not
// stop the others. Applied.Error is set when the state was not applied as a whole: ctx
// ended, pruning was skipped, or a kind could not be listed for pruning.
func (a *Applier) Apply(ctx context.Context, state protocol.DesiredState) protocol.Applied {
	a.mu.Lock()
	defer a.mu.Unlock()

	out := protocol.Applied{Generation: state.Generation, Hash: state.Hash, Results: []protocol.ObjectResult{}}
	log := a.log.With("generation", state.Generation, "hash", state.Hash)
	failures := 0
	report := func(r protocol.ObjectResult) {
		if r.Action == protocol.ActionRefused || r.Action == protocol.ActionFailed {
			// Counted, not listed nor logged, past the first: see maxListedFailures.
			if failures++; failures > maxListedFailures {
				return
			}
			r = clipped(r)
		}
		out.Results = append(out.Results, r)
		level := slog.LevelInfo
		switch r.Action {
		case protocol.ActionUnchanged, protocol.ActionSkipped:
			level = slog.LevelDebug
		case protocol.ActionRefused, protocol.ActionFailed:
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "object "+string(r.Action), "apiVersion", r.APIVersion, "kind", r.Kind,
			"namespace", r.Namespace, "name", r.Name, "uid", r.UID, "message", r.Message)
	}
	var errs []error
	// unlisted says how many failures the report does not list, once the failures are
	// all known.
	unlisted := func() error {
		if failures <= maxListedFailures {
			return nil
		}
		log.Warn("more objects failed or were refused than a report lists", "failed", failures, "listed", maxListedFailures)
		return fmt.Errorf("%d objects failed or were refused; the report lists the first %d", failures, maxListedFailures)
	}

	var desired []*unstructured.Unstructured
	keep := map[objectKey]bool{}
	undecodable := 0
	if state.Decommission {
		if len(state.Objects) > 0 {
			log.Info("decommission: ignoring the objects of the desired state", "objects", len(state.Objects))
		}
	} else {
		for i, raw := range state.Objects {
			u, res, ok := a.decode(i, raw)
			if u == nil {
				undecodable++
			} else {
				keep[keyOf(u.GroupVersionKind(), u.GetNamespace(), u.GetName())] = true
			}
			if !ok {
				report(res)
				continue
			}
			desired = append(desired, u)
		}
	}

	sortForApply(desired)
	for _, u := range desired {
		if err := ctx.Err(); err != nil {
			out.Error = errors.Join(fmt.Errorf("applying stopped before %s: %w", protocol.ClipTo(describe(u), maxResultText), err), unlisted()).Error()
			return out
		}
		report(a.applyOne(ctx, u))
	}

	if undecodable > 0 {
		errs = append(errs, fmt.Errorf("pruning skipped: %d objects of the desired state could not be decoded, so what they name is unknown", undecodable))
	} else {
		kinds := pruneKinds(desired, a.extraKinds)
		if err := a.prune(ctx, kinds, keep, report); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(append(errs, unlisted())...); err != nil {
		out.Error = err.Error()
	}
	log.Info("applied desired state", "objects", len(desired), "results", len(out.Results), "complete", out.Complete())
	return out
}

// decode turns the i-th object of the desired state into an unstructured object, and
// checks that it is labeled for this identity. u is nil when the object cannot even be
// named; ok is false when it must not be applied, and res then says why.
func (a *Applier) decode(i int, raw []byte) (u *unstructured.Unstructured, res protocol.ObjectResult, ok bool) {
	u = &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, protocol.ObjectResult{
			Action:  protocol.ActionFailed,
			Message: fmt.Sprintf("object %d of the desired state cannot be decoded: %v", i, err),
		}, false
	}
	res = resultOf(u)
	if u.GetName() == "" {
		res.Action = protocol.ActionFailed
		res.Message = fmt.Sprintf("object %d of the desired state (%s) has no metadata.name", i, u.GetKind())
		return nil, res, false
	}
	labels := u.GetLabels()
	if labels[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue || labels[a.ownerLabel] != a.identity {
		res.Action = protocol.ActionFailed
		res.Message = fmt.Sprintf("%s is not labeled %s=%s and %s=%s (it has %q and %q): the hub must only send objects of this WorkerCluster; not applied",
			describe(u), v1alpha1.ManagedByLabel, v1alpha1.ManagedByValue, a.ownerLabel, a.identity,
			labels[v1alpha1.ManagedByLabel], labels[a.ownerLabel])
		return u, res, false
	}
	return u, res, true
}

// applyOne applies one desired object, unless the live object is not this identity's or
// is create-only.
func (a *Applier) applyOne(ctx context.Context, u *unstructured.Unstructured) protocol.ObjectResult {
	res := resultOf(u)
	fail := func(err error) protocol.ObjectResult {
		res.Action = protocol.ActionFailed
		res.Message = err.Error()
		return res
	}

	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(u.GroupVersionKind())
	err := a.client.Get(ctx, client.ObjectKeyFromObject(u), live)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fail(fmt.Errorf("%s: reading the live object: %w", describe(u), err))
	default:
		res.UID = string(live.GetUID())
		owner, labeled := live.GetLabels()[a.ownerLabel]
		if u.GetAnnotations()[v1alpha1.ApplyAnnotation] == v1alpha1.ApplyIfNotPresent {
			res.Action = protocol.ActionSkipped
			res.Message = fmt.Sprintf("exists; created only when missing (%s: %s)", v1alpha1.ApplyAnnotation, v1alpha1.ApplyIfNotPresent)
			if owner != a.identity {
				res.Message += "; not created by this WorkerCluster"
			}
			return res
		}
		if owner != a.identity {
			res.Action = protocol.ActionRefused
			res.Message = refusal(live, a.ownerLabel, a.identity, owner, labeled)
			return res
		}
	}

	existed := res.UID != ""
	applied := u.DeepCopy()
	if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner(a.fieldOwner), client.ForceOwnership); err != nil {
		return fail(fmt.Errorf("%s: applying: %w", describe(u), err))
	}
	// An apply that changes nothing is not written, so the resourceVersion tells.
	switch {
	case !existed:
		res.Action = protocol.ActionCreated
	case applied.GetResourceVersion() != live.GetResourceVersion():
		res.Action = protocol.ActionConfigured
	default:
		res.Action = protocol.ActionUnchanged
	}
	res.UID = string(applied.GetUID())
	return res
}

// describe names an object as kubectl does: Kind/namespace/name.
func describe(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetKind() + "/" + u.GetName()
	}
	return u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
}

// refusal says why live is not adopted and how an operator hands it over.
func refusal(live *unstructured.Unstructured, label, identity, owner string, labeled bool) string {
	whose := fmt.Sprintf("it has no %s label", label)
	if labeled {
		whose = fmt.Sprintf("it belongs to %s=%q", label, owner)
		if label == v1alpha1.WorkerClusterLabel {
			whose = fmt.Sprintf("it belongs to WorkerCluster %q", owner)
		}
	}
	return fmt.Sprintf("%s: %s (uid %s): %s; label it %s=%s to hand it over",
		RefusePrefix, describe(live), live.GetUID(), whose, label, identity)
}

// clipped is r with each text clipped to maxResultText: the desired state chose them, or
// an API server echoing it did, and a failure need not have been held to any length.
func clipped(r protocol.ObjectResult) protocol.ObjectResult {
	for _, s := range []*string{&r.APIVersion, &r.Kind, &r.Namespace, &r.Name, &r.Message} {
		*s = protocol.ClipTo(*s, maxResultText)
	}
	return r
}

func resultOf(u *unstructured.Unstructured) protocol.ObjectResult {
	return protocol.ObjectResult{
		APIVersion: u.GetAPIVersion(),
		Kind:       u.GetKind(),
		Namespace:  u.GetNamespace(),
		Name:       u.GetName(),
	}
}
