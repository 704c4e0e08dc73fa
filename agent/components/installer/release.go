package installer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	ri "helm.sh/helm/v4/pkg/release"
	rcommon "helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"helm.sh/helm/v4/pkg/storage/driver"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// ReleaseLabel marks a Helm release as flotilla's, with the value ReleaseLabelValue.
// Helm keeps it on the release's records (the Secrets sh.helm.release.v1.*), so a run
// that finds a release of Kueue or JobSet knows whether flotilla made it.
const (
	ReleaseLabel      = "app.kubernetes.io/managed-by"
	ReleaseLabelValue = "flotilla"
)

const (
	// maxHistory is the number of revisions Helm keeps of a release: enough to see the
	// last few upgrades, few enough that the records stay small.
	maxHistory = 5
	// hookTimeout bounds each Helm hook; neither chart has hooks today.
	hookTimeout = 5 * time.Minute
	// stalePending is how long a release may stay pending-install, pending-upgrade or
	// uninstalling before a run takes it for interrupted. A run never waits for
	// readiness and takes seconds; one that finds a younger pending release leaves it to
	// the run that may still be making it.
	stalePending = 5 * time.Minute
)

func releaseLabels() map[string]string { return map[string]string{ReleaseLabel: ReleaseLabelValue} }

func isOurs(rel *release.Release) bool {
	return rel != nil && rel.Labels[ReleaseLabel] == ReleaseLabelValue
}

// interrupted reports whether rel is the record of a run that has not finished.
func interrupted(rel *release.Release) bool {
	return rel.Info.Status.IsPending() || rel.Info.Status == rcommon.StatusUninstalling
}

// applyOne brings one component to spec. Nothing on the worker changes before the
// brownfield check has passed.
func (in *Installer) applyOne(ctx context.Context, s *session, c components.Component, spec components.Spec) components.Status {
	st := components.Status{Component: c, Version: spec.Release(c).Version}
	fail := func(err error) components.Status {
		st.Action, st.Message = components.ActionFailed, err.Error()
		return st
	}
	t, err := in.load(c, spec)
	if err != nil {
		return fail(err)
	}
	hc := s.helm[c]
	last, err := lastRelease(hc, t.name)
	if err != nil {
		return fail(fmt.Errorf("reading Helm release %s: %w", t.release(), err))
	}

	adopt := false
	if !isOurs(last) {
		b, err := s.scan(ctx, hc, t, last)
		if err != nil {
			return fail(err)
		}
		if !b.empty() {
			if !spec.Adopt {
				st.Action, st.Message = components.ActionRefused, b.refusal(t)
				return st
			}
			if why := b.cannotAdopt(t); why != "" {
				st.Action, st.Message = components.ActionRefused, why
				return st
			}
			adopt = true
		}
	}

	recovered := ""
	if last != nil && interrupted(last) {
		since := last.Info.LastDeployed
		if age := time.Since(since); age < stalePending {
			return fail(fmt.Errorf("the Helm release %s revision %d is %s since %s: another run is still at work, or was stopped less than %v ago; the next run takes it over",
				t.release(), last.Version, last.Info.Status, since.UTC().Format(time.RFC3339), stalePending))
		}
		// A run that was killed half-way (the agent's pod evicted, the node lost)
		// leaves its revision pending for ever, and Helm refuses to upgrade a pending
		// release. The revision is marked failed, as Flux's helm-controller does,
		// and upgraded like any failed one: nothing is deleted.
		recovered = fmt.Sprintf("revision %d was left %s by a run that stopped at %s, and is marked failed", last.Version, last.Info.Status, since.UTC().Format(time.RFC3339))
		last.SetStatus(rcommon.StatusFailed, "interrupted; marked failed by "+components.BinaryName)
		if err := hc.Releases.Update(last); err != nil {
			return fail(fmt.Errorf("marking the interrupted revision %d of Helm release %s failed: %w", last.Version, t.release(), err))
		}
	}

	changed, err := s.applyCRDs(ctx, t.chart)
	if err != nil {
		return fail(fmt.Errorf("%s %s: %w", c, t.version, err))
	}
	crds := ""
	if len(changed) > 0 {
		crds = fmt.Sprintf("applied CRDs %v from the chart's crds/", changed)
	}

	switch {
	case last == nil || last.Info.Status == rcommon.StatusUninstalled:
		rel, err := t.install(ctx, hc, adopt, last != nil)
		if err != nil {
			return fail(fmt.Errorf("installing %s %s as Helm release %s: %w", c, t.version, t.release(), err))
		}
		st.Action = components.ActionInstalled
		verb := "installed"
		if adopt {
			st.Action, verb = components.ActionAdopted, "took over the objects found, with their UIDs, and installed"
		}
		st.Message = joinSentences(fmt.Sprintf("%s %s %s (chart %s) as Helm release %s, revision %d", verb, c, t.version, chartRef(rel.Chart), t.release(), rel.Version), crds)
	case !adopt && !interrupted(last) && last.Info.Status == rcommon.StatusDeployed && unchanged(last, t):
		st.Action = components.ActionUnchanged
		st.Message = joinSentences(fmt.Sprintf("Helm release %s revision %d already runs chart %s with these values", t.release(), last.Version, chartRef(last.Chart)), crds)
	default:
		from := chartRef(last.Chart)
		rel, err := t.upgrade(ctx, hc, adopt)
		if err != nil {
			return fail(fmt.Errorf("upgrading Helm release %s to %s %s: %w", t.release(), c, t.version, withNote(err, recovered)))
		}
		st.Action = components.ActionUpgraded
		what := fmt.Sprintf("upgraded Helm release %s from chart %s to %s, revision %d", t.release(), from, chartRef(rel.Chart), rel.Version)
		if adopt {
			st.Action = components.ActionAdopted
			what = fmt.Sprintf("took over Helm release %s (chart %s) and upgraded it to %s, revision %d", t.release(), from, chartRef(rel.Chart), rel.Version)
		}
		st.Message = joinSentences(what, recovered, crds)
	}
	return st
}

// withNote adds what the run did before err, when it did something.
func withNote(err error, note string) error {
	if note == "" {
		return err
	}
	return fmt.Errorf("%w (%s)", err, note)
}

// unchanged reports whether the deployed release last is what t would install: the same
// chart version, the same values, and marked as flotilla's.
func unchanged(last *release.Release, t *target) bool {
	return isOurs(last) && last.Chart != nil && last.Chart.Metadata != nil &&
		last.Chart.Metadata.Version == t.chart.Metadata.Version && sameValues(last.Config, t.values)
}

// lastRelease is the newest revision of the release name, or nil when there is none.
func lastRelease(hc *action.Configuration, name string) (*release.Release, error) {
	h, err := hc.Releases.History(name)
	if errors.Is(err, driver.ErrReleaseNotFound) || (err == nil && len(h) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rels := make([]*release.Release, 0, len(h))
	for _, r := range h {
		v1, err := asV1(r)
		if err != nil {
			return nil, err
		}
		rels = append(rels, v1)
	}
	releaseutil.Reverse(rels, releaseutil.SortByRevision)
	return rels[0], nil
}

func asV1(r ri.Releaser) (*release.Release, error) {
	switch r := r.(type) {
	case *release.Release:
		return r, nil
	case release.Release:
		return &r, nil
	}
	return nil, fmt.Errorf("a Helm release record of type %T", r)
}

// install makes the release. adopt takes over objects that exist already (TakeOwnership,
// for this one install only); replace reuses the name of a release uninstalled with its
// history kept.
func (t *target) install(ctx context.Context, hc *action.Configuration, adopt, replace bool) (*release.Release, error) {
	in := action.NewInstall(hc)
	in.ReleaseName, in.Namespace = t.name, t.namespace
	in.CreateNamespace = true
	// JobSet's crds/ were applied by applyCRDs; Kueue has none.
	in.SkipCRDs = true
	// No waiting: the agent judges readiness by the components' own answers.
	in.WaitStrategy = kube.HookOnlyStrategy
	in.WaitOptions = []kube.WaitOption{kube.WithWaitContext(ctx)}
	in.Timeout = hookTimeout
	in.Labels = releaseLabels()
	in.PostRenderer = keepCRDs{}
	in.TakeOwnership = adopt
	// Adopted objects were written by someone else, whose field managers would
	// otherwise conflict with every field the chart sets differently.
	in.ForceConflicts = adopt
	in.Replace = replace
	in.Description = "Installed by " + components.BinaryName
	// Client-side validation fetches the server's OpenAPI document group by group,
	// seconds of work, to check what the API server checks anyway: Helm applies with
	// strict field validation.
	in.DisableOpenAPIValidation = true
	r, err := in.RunWithContext(ctx, t.chart, t.values)
	if err != nil {
		return nil, err
	}
	return asV1(r)
}

// upgrade moves the release to t; adopt takes over a release flotilla did not make.
func (t *target) upgrade(ctx context.Context, hc *action.Configuration, adopt bool) (*release.Release, error) {
	up := action.NewUpgrade(hc)
	up.Namespace = t.namespace
	up.ServerSideApply = "true"
	// The release owns the fields its chart sets: a hand edit of one (an image, a
	// replica count) is put back, as Helm 3's three-way merge did.
	up.ForceConflicts = true
	up.ResetValues = true
	up.WaitStrategy = kube.HookOnlyStrategy
	up.WaitOptions = []kube.WaitOption{kube.WithWaitContext(ctx)}
	up.Timeout = hookTimeout
	up.MaxHistory = maxHistory
	up.Labels = releaseLabels()
	up.PostRenderer = keepCRDs{}
	up.TakeOwnership = adopt
	up.Description = "Upgraded by " + components.BinaryName
	up.DisableOpenAPIValidation = true // as in install
	r, err := up.RunWithContext(ctx, t.name, t.chart, t.values)
	if err != nil {
		return nil, err
	}
	return asV1(r)
}
