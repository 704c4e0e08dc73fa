// Package plan computes what merging a pull request of a fleet repository would do: for
// each cluster it touches, whether the cluster is added, removed, changed or left as it
// is, the problems of the pull request's head, and the rendered objects of both sides
// with a diff between them. The hub posts the outcome as the pull request's plan commit
// status and serves the details on a page the status links to.
//
// A plan only reads: computing one never changes anything on a worker.
package plan

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
)

// ContextName is the plan status's context after the fleet's prefix: "<prefix>/plan".
const ContextName = fleet.PlanContextName

// MaxDescription is the longest status description posted: GitHub's limit, the
// smallest of the forges'.
const MaxDescription = 140

// DefaultMaxRendered is how many clusters of one plan are rendered on both sides and
// diffed unless Options say otherwise. A fleet-wide change to a large fleet would
// otherwise render every cluster twice and keep its objects in memory for as long as the
// plan is served; the clusters past the limit are summarized from their directories.
const DefaultMaxRendered = 200

// Options bound what computing one plan may cost.
type Options struct {
	// MaxRendered is how many clusters are rendered and diffed; <= 0 means
	// DefaultMaxRendered. The others are summarized: added, removed or changed as their
	// directories say, with the problems the loader found, but no objects.
	MaxRendered int
	// Budget bounds what is read of each side; the zero value is fleet's default.
	Budget fleet.Budget
}

// Change is what merging does to a cluster or to one of its objects.
type Change string

const (
	Added     Change = "added"
	Removed   Change = "removed"
	Changed   Change = "changed"
	Unchanged Change = "unchanged"
)

// Plan is what merging one pull request's head would change.
type Plan struct {
	// PullRequest is the pull request's number and Ref the forge's ref for its head.
	PullRequest int    `json:"pullRequest"`
	Ref         string `json:"ref"`
	// Commit is the head the plan is for, and the commit its status goes on.
	Commit string `json:"commit"`
	// Base is the commit the head is compared with. BaseFound is false when that is the
	// branch's head because the fork point lies too far back; clusters that changed on
	// the branch since then are then part of the plan too.
	Base      string `json:"base"`
	BaseFound bool   `json:"baseFound"`
	// AllClusters is set when a fleet-wide file changed, so that every cluster is
	// planned; Reason says which.
	AllClusters bool   `json:"allClusters"`
	Reason      string `json:"reason,omitempty"`
	// Tenant is the tenant the head's fleet.yaml names.
	Tenant string `json:"tenant,omitempty"`
	// FleetErrors are the head's problems with fleet.yaml and the presets: they fail
	// the plan and keep every cluster of the head from rendering.
	FleetErrors fleet.ErrorList `json:"fleetErrors"`
	// Clusters are the planned clusters, by name.
	Clusters []*ClusterPlan `json:"clusters"`
	Counts   Counts         `json:"counts"`
	// MaxRendered is the limit the plan was computed with, for its summary.
	MaxRendered int `json:"maxRendered"`
}

// Counts sum up a plan.
type Counts struct {
	Added     int `json:"added"`
	Changed   int `json:"changed"`
	Removed   int `json:"removed"`
	Unchanged int `json:"unchanged"`
	// Objects is how many objects are added, removed or modified over all rendered
	// clusters.
	Objects int `json:"objects"`
	// Summarized is how many clusters were past the plan's render limit: they are in
	// none of the counts above.
	Summarized int `json:"summarized"`
}

// ClusterPlan is what merging does to one cluster.
type ClusterPlan struct {
	Name string `json:"name"`
	// Change is Added or Removed when the cluster's directory exists on one side only,
	// Unchanged when both sides render the same objects, and Changed otherwise,
	// including when either side cannot be rendered.
	Change Change `json:"change"`
	// Errors are the head's problems with this cluster: validation, then rendering.
	Errors fleet.ErrorList `json:"errors"`
	// BaseErrors say why the base could not be rendered; the diff then shows the head's
	// objects as added. They do not fail the plan: the pull request may be the fix.
	BaseErrors fleet.ErrorList `json:"baseErrors,omitempty"`
	// BaseHash and HeadHash are the desired generations of both sides; empty for a side
	// that has no cluster or does not render.
	BaseHash string `json:"baseHash,omitempty"`
	HeadHash string `json:"headHash,omitempty"`
	// Objects are the objects that differ, in the order the agent applies them, then
	// those removed.
	Objects []ObjectDiff `json:"objects"`
	// BaseYAML and HeadYAML are the rendered objects of both sides, kept for a changed
	// cluster only.
	BaseYAML string `json:"baseYAML,omitempty"`
	HeadYAML string `json:"headYAML,omitempty"`
	// Summarized is set for a cluster past the plan's render limit: its Change comes
	// from its directories alone (Changed meaning that its inputs changed), and it has
	// no objects, hashes or YAML. Its Errors are still the loader's.
	Summarized bool `json:"summarized,omitempty"`
}

// ObjectDiff is one object that merging adds, removes or modifies.
type ObjectDiff struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	Change     Change `json:"change"`
	// Note says when the worker does not follow the change: an object the agent never
	// prunes stays when removed, one it only creates when missing is not updated.
	Note string `json:"note,omitempty"`
	// Diff is the unified diff of the object's YAML.
	Diff string `json:"diff,omitempty"`
}

// String names the object as an operator reads it: "LocalQueue ml-training/user-queue".
func (o ObjectDiff) String() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}

// Diff is the cluster's whole diff: its objects' diffs one after the other.
func (c *ClusterPlan) Diff() string {
	var b strings.Builder
	for _, o := range c.Objects {
		b.WriteString(o.Diff)
	}
	return b.String()
}

// Errors is every problem that fails the plan: the fleet's, then each cluster's.
func (p *Plan) Errors() fleet.ErrorList {
	all := slices.Clone(p.FleetErrors)
	for _, c := range p.Clusters {
		all = append(all, c.Errors...)
	}
	return all
}

// RequireTenant fails the plan when the head names another tenant than the one its
// repository holds: the hub would refuse that head on merge, so its plan says so first.
func (p *Plan) RequireTenant(tenant string) {
	if p.Tenant == "" || p.Tenant == tenant {
		return
	}
	p.FleetErrors = append(p.FleetErrors, fleet.Error{File: fleet.FleetFile,
		Message: fmt.Sprintf("names tenant %q; this repository may only hold tenant %q", p.Tenant, tenant)})
	p.FleetErrors.Sort()
}

// Cluster returns the plan of the named cluster, or nil when it is not planned.
func (p *Plan) Cluster(name string) *ClusterPlan {
	i, ok := slices.BinarySearchFunc(p.Clusters, name, func(c *ClusterPlan, n string) int { return cmp.Compare(c.Name, n) })
	if !ok {
		return nil
	}
	return p.Clusters[i]
}

// State is Failure when the head has problems, Success otherwise.
func (p *Plan) State() commitstatus.State {
	if len(p.FleetErrors) > 0 {
		return commitstatus.Failure
	}
	for _, c := range p.Clusters {
		if len(c.Errors) > 0 {
			return commitstatus.Failure
		}
	}
	return commitstatus.Success
}

// Summary says in one line what the plan found: the head's first problems, or the
// counts of clusters and objects merging would change.
func (p *Plan) Summary() string {
	if errs := p.Errors(); len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			// Kustomize's messages span lines; a status description is one.
			msgs[i] = strings.Join(strings.Fields(e.Error()), " ")
		}
		if len(errs) == 1 {
			return msgs[0]
		}
		return fmt.Sprintf("%d errors: %s", len(errs), strings.Join(msgs, "; "))
	}
	c := p.Counts
	var s string
	if len(p.Clusters) == 0 {
		s = "no cluster changes"

	} else {
		s = fmt.Sprintf("+%d %s, ~%d, -%d", c.Added, plural(c.Added, "cluster"), c.Changed, c.Removed)
		if c.Unchanged > 0 {
			s += fmt.Sprintf(", %d unchanged", c.Unchanged)
		}
		s += fmt.Sprintf(" · %d %s changed", c.Objects, plural(c.Objects, "object"))
	}
	if c.Summarized > 0 {
		s += fmt.Sprintf(" · %d more %s not rendered (a plan renders %d)", c.Summarized, plural(c.Summarized, "cluster"), p.MaxRendered)
	}
	if !p.BaseFound {
		s += " · compared with the branch's head"
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// Context is the plan status's context for a fleet's status context prefix; an empty
// prefix is the default one.
func Context(prefix string) string {
	if prefix == "" {
		prefix = fleet.DefaultStatusContextPrefix
	}
	return prefix + "/" + ContextName
}

// Status is the commit status to post on the head: the plan's state with its summary
// cut to MaxDescription, linking to url, where the plan's page is served.
func (p *Plan) Status(prefix, url string) commitstatus.Status {
	return commitstatus.Status{
		Context:     Context(prefix),
		State:       p.State(),
		Description: commitstatus.Truncate(p.Summary(), MaxDescription),
		TargetURL:   url,
	}
}

// Compute plans pr: it loads the fleet at the pull request's base and head and, for the
// clusters the pull request changes (every cluster of either side when it changes a
// fleet-wide file), renders both sides and compares them, up to opts.MaxRendered
// clusters; the rest are summarized. Problems with the repository's content are part
// of the plan; an error is returned only when planning itself fails, or ctx ends.
func Compute(ctx context.Context, pr *gitsource.PullRequest, r *render.Renderer, opts Options) (*Plan, error) {
	if opts.MaxRendered <= 0 {
		opts.MaxRendered = DefaultMaxRendered
	}
	load := fleet.LoadOptions{Budget: opts.Budget}
	base, head := fleet.LoadWith(pr.BaseFS(), load), fleet.LoadWith(pr.FS(), load)
	// gitsource names the changed paths; the fleet model says which clusters they touch,
	// through the symbolic links of either side.
	aff := fleet.Change{All: pr.Changes.All, Reason: pr.Changes.Reason, Paths: pr.Changes.Paths, FirstChange: pr.Changes.FirstChange}.AffectedIn(base, head)
	p := &Plan{
		PullRequest: pr.Number,
		Ref:         pr.Ref,
		Commit:      pr.Head.String(),
		Base:        pr.Base.String(),
		BaseFound:   pr.BaseFound,
		AllClusters: aff.All,
		Reason:      aff.Reason,
		MaxRendered: opts.MaxRendered,
	}
	if head.Spec != nil {
		p.Tenant = head.Spec.Spec.Tenant
	}
	if !head.Valid() {
		p.FleetErrors = slices.Clone(head.Errors)
		if len(p.FleetErrors) == 0 {
			p.FleetErrors = fleet.ErrorList{{File: fleet.FleetFile, Message: "fleet.yaml could not be read"}}
		}
		p.FleetErrors.Sort()
		p.FleetErrors = slices.Compact(p.FleetErrors)
	}

	names := aff.Clusters
	if aff.All {
		names = append(base.ClusterNames(), head.ClusterNames()...)
	}
	names = slices.Compact(slices.Sorted(slices.Values(names)))

	rendered := 0
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("planning %s at %s: %w", pr.Ref, p.Commit, err)
		}
		var c *ClusterPlan
		if rendered < opts.MaxRendered {
			var err error
			if c, err = planCluster(r, base, head, name); err != nil {
				return nil, fmt.Errorf("planning %s at %s: cluster %q: %w", pr.Ref, p.Commit, name, err)
			}
			if c != nil {
				rendered++
			}
		} else if c = summarizeCluster(base, head, name); c != nil {
			p.Counts.Summarized++
			p.Clusters = append(p.Clusters, c)
			continue
		}
		if c == nil {
			continue
		}
		switch c.Change {
		case Added:
			p.Counts.Added++
		case Removed:
			p.Counts.Removed++
		case Changed:
			p.Counts.Changed++
		case Unchanged:
			p.Counts.Unchanged++
		}
		p.Counts.Objects += len(c.Objects)
		p.Clusters = append(p.Clusters, c)
	}
	return p, nil
}

// summarizeCluster is the plan of a cluster past the render limit: what its directories
// say, and the head's problems the loader found; nil when neither side has it.
func summarizeCluster(base, head *fleet.Fleet, name string) *ClusterPlan {
	bc, hc := base.Clusters[name], head.Clusters[name]
	c := &ClusterPlan{Name: name, Summarized: true, Change: Changed}
	switch {
	case bc == nil && hc == nil:
		return nil
	case bc == nil:
		c.Change = Added
	case hc == nil:
		c.Change = Removed
	}
	if hc != nil {
		c.Errors = slices.Clone(hc.Errors)
	}
	return c
}

// planCluster compares the named cluster on both sides; nil when neither has it, as for
// a file directly under clusters/.
func planCluster(r *render.Renderer, base, head *fleet.Fleet, name string) (*ClusterPlan, error) {
	bc, hc := base.Clusters[name], head.Clusters[name]
	if bc == nil && hc == nil {
		return nil, nil
	}
	c := &ClusterPlan{Name: name}
	var baseRes, headRes *render.Result
	var err error
	if bc != nil {
		if baseRes, c.BaseErrors, err = renderCluster(r, base, name); err != nil {
			return nil, fmt.Errorf("base: %w", err)
		}
	}
	if hc != nil {
		c.Errors = slices.Clone(hc.Errors)
		// An invalid fleet or cluster is refused by the renderer with the errors
		// already listed; only a valid one can add problems of its own.
		if head.Valid() && hc.Valid() {
			var errs fleet.ErrorList
			if headRes, errs, err = renderCluster(r, head, name); err != nil {
				return nil, fmt.Errorf("head: %w", err)
			}
			c.Errors = append(c.Errors, errs...)
		}
		c.Errors.Sort()
		c.Errors = slices.Compact(c.Errors)
	}
	if baseRes != nil {
		c.BaseHash = baseRes.Hash
	}
	if headRes != nil {
		c.HeadHash = headRes.Hash
	}
	switch {
	case bc == nil:
		c.Change = Added
	case hc == nil:
		c.Change = Removed
	case baseRes != nil && headRes != nil && baseRes.Hash == headRes.Hash:
		c.Change = Unchanged
		return c, nil
	default:
		c.Change = Changed
	}
	if hc != nil && headRes == nil {
		// The head's objects are unknown: comparing would show them all removed.
		return c, nil
	}
	if c.Objects, err = diffObjects(baseRes, headRes); err != nil {
		return nil, err
	}
	if c.BaseYAML, err = resultYAML(baseRes); err != nil {
		return nil, fmt.Errorf("base: %w", err)
	}
	if c.HeadYAML, err = resultYAML(headRes); err != nil {
		return nil, fmt.Errorf("head: %w", err)
	}
	return c, nil
}

// renderCluster renders one side. Problems with the content come back as a list;
// anything else is a failure of the renderer itself.
func renderCluster(r *render.Renderer, f *fleet.Fleet, name string) (*render.Result, fleet.ErrorList, error) {
	res, err := r.Render(f, name)
	var list fleet.ErrorList
	switch {
	case errors.As(err, &list):
		return nil, list, nil
	case err != nil:
		return nil, nil, err
	}
	return res, nil, nil
}

func resultYAML(res *render.Result) (string, error) {
	if res == nil {
		return "", nil
	}
	data, err := res.YAML()
	return string(data), err
}

// objectKey identifies an object across the two sides. The version is left out, so that
// moving an object to a new API version reads as a modification, not a removal and an
// addition.
type objectKey struct {
	group, kind, namespace, name string
}

func keyOf(u *unstructured.Unstructured) objectKey {
	gk := u.GroupVersionKind().GroupKind()
	return objectKey{gk.Group, gk.Kind, u.GetNamespace(), u.GetName()}
}

// diffObjects compares two renderings, either of which may be missing, object by object.
func diffObjects(base, head *render.Result) ([]ObjectDiff, error) {
	var baseObjs, headObjs []*unstructured.Unstructured
	if base != nil {
		baseObjs = base.Objects
	}
	if head != nil {
		headObjs = head.Objects
	}
	old := make(map[objectKey]*unstructured.Unstructured, len(baseObjs))
	for _, o := range baseObjs {
		old[keyOf(o)] = o
	}
	seen := make(map[objectKey]bool, len(headObjs))
	var out []ObjectDiff
	add := func(before, after *unstructured.Unstructured) error {
		d, err := diffObject(before, after)
		if err != nil || d == nil {
			return err
		}
		out = append(out, *d)
		return nil
	}
	for _, o := range headObjs {
		k := keyOf(o)
		seen[k] = true
		if err := add(old[k], o); err != nil {
			return nil, err
		}
	}
	for _, o := range baseObjs {
		if !seen[keyOf(o)] {
			if err := add(o, nil); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// diffObject compares one object's two sides, at least one of them present; nil when
// they are equal.
func diffObject(before, after *unstructured.Unstructured) (*ObjectDiff, error) {
	var oldYAML, newYAML string
	var err error
	if oldYAML, err = objectYAML(before); err != nil {
		return nil, err
	}
	if newYAML, err = objectYAML(after); err != nil {
		return nil, err
	}
	if oldYAML == newYAML {
		return nil, nil
	}
	shown := cmp.Or(after, before)
	d := &ObjectDiff{
		APIVersion: shown.GetAPIVersion(),
		Kind:       shown.GetKind(),
		Namespace:  shown.GetNamespace(),
		Name:       shown.GetName(),
		Change:     Changed,
	}
	oldName, newName := "a/"+objectPath(before), "b/"+objectPath(after)
	switch {
	case before == nil:
		d.Change, oldName = Added, "/dev/null"
	case after == nil:
		d.Change, newName = Removed, "/dev/null"
	}
	switch {
	case d.Change == Removed && before.GetAnnotations()[v1alpha1.PruneAnnotation] == v1alpha1.PruneDisabled:
		d.Note = "stays on the worker: it is never pruned (" + v1alpha1.PruneAnnotation + ": " + v1alpha1.PruneDisabled + ")"
	case d.Change == Changed && after.GetAnnotations()[v1alpha1.ApplyAnnotation] == v1alpha1.ApplyIfNotPresent:
		d.Note = "not updated on a worker that has it: it is only created when missing (" + v1alpha1.ApplyAnnotation + ": " + v1alpha1.ApplyIfNotPresent + ")"
	}
	d.Diff = unifiedDiff(oldName, newName, oldYAML, newYAML)
	return d, nil
}

func objectYAML(u *unstructured.Unstructured) (string, error) {
	if u == nil {
		return "", nil
	}
	data, err := yaml.Marshal(u.Object)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return string(data), nil
}

// objectPath names an object in a diff's header: group, kind, namespace and name.
func objectPath(u *unstructured.Unstructured) string {
	if u == nil {
		return ""
	}
	gk := u.GroupVersionKind().GroupKind()
	kind := gk.Kind
	if gk.Group != "" {
		kind = schema.GroupKind{Group: gk.Group, Kind: gk.Kind}.String()
	}
	return path.Join(kind, u.GetNamespace(), u.GetName())
}

// jsonError is a problem as machines read it: placed, and also as the one line people
// read.
type jsonError struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Cluster string `json:"cluster,omitempty"`
	Message string `json:"message"`
	Text    string `json:"text"`
}

func jsonErrors(list fleet.ErrorList) []jsonError {
	out := make([]jsonError, len(list))
	for i, e := range list {
		out[i] = jsonError{File: e.File, Line: e.Line, Column: e.Column, Cluster: e.Cluster, Message: e.Message, Text: e.Error()}
	}
	return out
}

// MarshalJSON adds the state and summary to the plan and writes problems with
// lower-case field names like the rest of it.
func (p *Plan) MarshalJSON() ([]byte, error) {
	type plain Plan
	return json.Marshal(struct {
		*plain
		State       commitstatus.State `json:"state"`
		Summary     string             `json:"summary"`
		FleetErrors []jsonError        `json:"fleetErrors"`
		Clusters    []*ClusterPlan     `json:"clusters"`
	}{(*plain)(p), p.State(), p.Summary(), jsonErrors(p.FleetErrors), nonNil(p.Clusters)})
}

// MarshalJSON writes problems with lower-case field names like the rest of the plan.
func (c *ClusterPlan) MarshalJSON() ([]byte, error) {
	type plain ClusterPlan
	return json.Marshal(struct {
		*plain
		Errors     []jsonError  `json:"errors"`
		BaseErrors []jsonError  `json:"baseErrors,omitempty"`
		Objects    []ObjectDiff `json:"objects"`
	}{(*plain)(c), jsonErrors(c.Errors), jsonErrors(c.BaseErrors), nonNil(c.Objects)})
}

// nonNil keeps an empty list a list in JSON, not null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
