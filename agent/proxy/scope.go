package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// OriginLabel is the label Kueue's MultiKueue puts on everything it creates on a worker,
// valued with its origin, and selects its lists and watches by.
const OriginLabel = "kueue.x-k8s.io/multikueue-origin"

// Scope is how far the hub's MultiKueue may reach into the worker: what the desired
// state the agent last applied says (protocol.Dispatch).
type Scope struct {
	// Origin is the hub Kueue's MultiKueue origin. Empty closes the proxy to everything
	// but discovery.
	Origin string
	// Namespaces are the workload namespaces the desired state names.
	Namespaces []string
}

// Excluded is a namespace of a desired state that the proxy left out of its scope, and
// why.
type Excluded struct {
	Namespace string
	Reason    string
}

// scope is a Scope in force: the namespaces as a set, narrowed as the package doc says.
// Its zero value, the scope before the agent applied a desired state, admits nothing
// but discovery.
type scope struct {
	origin     string
	namespaces map[string]bool
}

// narrow is s as the handler enforces it: the administrator's allowlist (when set)
// intersected with s.Namespaces, less the namespaces no hub may reach whatever Git says.
// An origin that is no label value closes the scope.
func (h *Handler) narrow(s Scope) (*scope, []Excluded) {
	if s.Origin == "" || len(validation.IsValidLabelValue(s.Origin)) > 0 {
		var out []Excluded
		for _, ns := range s.Namespaces {
			out = append(out, Excluded{Namespace: ns, Reason: fmt.Sprintf("the hub sent no usable MultiKueue origin (%q)", protocol.Clip(s.Origin))})
		}
		return &scope{}, out
	}
	sc := &scope{origin: s.Origin, namespaces: map[string]bool{}}
	var out []Excluded
	for _, ns := range s.Namespaces {
		if why := h.reserved(ns); why != "" {
			out = append(out, Excluded{Namespace: ns, Reason: why})
			continue
		}
		if len(h.allowNamespaces) > 0 && !slices.Contains(h.allowNamespaces, ns) {
			out = append(out, Excluded{Namespace: ns, Reason: "it is not among the namespaces this worker's administrator allows (dispatch.namespaces in the agent's Helm values)"})
			continue
		}
		sc.namespaces[ns] = true
	}
	return sc, out
}

// reserved says why no request may ever reach ns, or "": the agent's own namespace holds
// its credential and the identities it may impersonate; kube-* and the components'
// namespaces run what the worker itself runs on. A job there could run as any of their
// ServiceAccounts or mount their Secrets.
func (h *Handler) reserved(ns string) string {
	switch {
	case len(validation.IsDNS1123Label(ns)) > 0:
		return "it is not a namespace name"
	case ns == h.namespace:
		return "it is the agent's own namespace"
	case strings.HasPrefix(ns, "kube-"):
		return "it is a Kubernetes system namespace"
	case ns == "kueue-system" || ns == "jobset-system":
		return "it is where the worker's Kueue and JobSet run"
	}
	return ""
}

// SetScope makes s, narrowed, the proxy's scope, and binds the dispatch identity's
// namespaced rules in exactly the namespaces of that scope (see Binder). A namespace
// widens the scope only once its binding is in place, and leaves it before its binding
// goes, so that the agent never lets through what the API server would refuse and the
// API server never grants what the agent would refuse for longer than a request takes.
// It returns the namespaces left out and why; the error is of the bindings, and the
// scope is set all the same.
func (h *Handler) SetScope(ctx context.Context, s Scope) ([]Excluded, error) {
	h.scopeMu.Lock()
	defer h.scopeMu.Unlock()
	sc, excluded := h.narrow(s)
	var errs []error
	if h.binder != nil {
		for _, ns := range sortedKeys(sc.namespaces) {
			if err := h.binder.bind(ctx, ns); err != nil {
				delete(sc.namespaces, ns)
				excluded = append(excluded, Excluded{Namespace: ns, Reason: "its RoleBinding could not be written: " + err.Error()})
				errs = append(errs, err)
			}
		}
	}
	h.scope.Store(sc)
	h.scopedOnce.Do(func() { close(h.scoped) })
	if h.binder != nil {
		if err := h.binder.unbindExcept(ctx, sc.namespaces); err != nil {
			errs = append(errs, err)
		}
	}
	return excluded, errors.Join(errs...)
}

// Scope is the scope in force.
func (h *Handler) Scope() Scope {
	sc := h.scope.Load()
	return Scope{Origin: sc.origin, Namespaces: sortedKeys(sc.namespaces)}
}

// admits checks req against the scope: its namespace, and the origin its list or watch
// selects by. What the objects carry is checked on them (guard.go).
func (sc *scope) admits(req request, rawSelector string, selectorGiven bool) *refusal {
	if sc.origin == "" {
		return refusef("the hub has not sent this agent a dispatch scope yet (or its fleet dispatches nothing to this worker)")
	}
	if req.namespace != "" && !sc.namespaces[req.namespace] {
		return refusef("namespace %s is not one of this worker's workload namespaces", req.namespace)
	}
	if req.verb != "list" && req.verb != "watch" {
		return nil
	}
	if !selectorGiven {
		return refusef("a %s must select %s=%s", req.verb, OriginLabel, sc.origin)
	}
	sel, err := labels.Parse(rawSelector)
	if err != nil {
		return refusef("the label selector does not parse")
	}
	reqs, _ := sel.Requirements()
	for _, r := range reqs {
		if r.Key() != OriginLabel {
			continue
		}
		// Every requirement narrows: one that admits the hub's origin alone is enough,
		// whatever the others say.
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			if vals := r.Values(); vals.Len() == 1 && vals.Has(sc.origin) {
				return nil
			}
		}
	}
	return refusef("a %s must select %s=%s", req.verb, OriginLabel, sc.origin)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
