package installer

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"k8s.io/client-go/rest"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/charts"
)

// Installer installs, upgrades and uninstalls the components on one worker.
type Installer struct {
	// Config reaches the worker's API server.
	Config *rest.Config
	// Log receives what the installer and Helm do; nil discards it.
	Log *slog.Logger
	// Chart returns the packaged chart of a component at a version; nil is
	// charts.Archive, the charts embedded in this build.
	Chart func(c components.Component, version string) ([]byte, error)
	// Images is the worker's policy: a spec naming an image outside it installs nothing.
	// The zero value allows registry.k8s.io alone.
	Images components.ImagePolicy
}

func (in *Installer) logger() *slog.Logger {
	if in.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return in.Log
}

// Apply brings each component to the version spec names, in components.All's order,
// and reports what it did to each. A component's failure is in its Status; the error
// is for a run that could not be made at all, such as an API server that does not
// answer, or a context that ended.
func (in *Installer) Apply(ctx context.Context, spec components.Spec) (components.Report, error) {
	if spec.Managed {
		// Before anything is read or written: the images are what the charts' controllers
		// run with the rights this installer grants them.
		if refused := in.Images.Refused(spec); refused != nil {
			in.logger().WarnContext(ctx, "the worker's image policy refuses the desired components; nothing is installed",
				"reason", refused[0].Reason, "message", refused[0].Message)
			return components.Report{Components: refused}, nil
		}
	}
	s, err := in.connect(ctx)
	if err != nil {
		return components.Report{}, err
	}
	var rep components.Report
	var failed *components.Status
	for _, c := range components.All() {
		version := spec.Release(c).Version
		var st components.Status
		switch {
		case !spec.Managed:
			st = components.Status{Component: c, Version: version, Action: components.ActionUnchanged,
				Message: "not managed by flotilla (spec.components.managed: false): left alone"}
		case failed != nil:
			// The order is the components' dependency order: Kueue's integrations
			// watch JobSets, and a JobSet that failed half-way may have left its CRDs
			// behind the version this Kueue expects. A refused JobSet does not stop
			// Kueue: it is someone's running JobSet, CRDs included.
			st = components.Status{Component: c, Version: version, Action: components.ActionFailed,
				Message: fmt.Sprintf("not attempted: %s %s failed first, and %s needs it", failed.Component, failed.Version, c)}
		default:
			st = in.applyOne(ctx, s, c, spec)
		}
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("applying %s %s: %w", c, version, err)
		}
		s.log.InfoContext(ctx, "component applied", "component", string(c), "version", version, "action", string(st.Action), "message", st.Message)
		rep.Components = append(rep.Components, st)
		if st.Action == components.ActionFailed && failed == nil {
			failed = &st
		}
	}
	return rep, nil
}

// target is one component at the version a run brings it to.
type target struct {
	c         components.Component
	version   string
	name      string
	namespace string
	chart     *chart.Chart
	values    map[string]any
}

func (t *target) release() string { return t.namespace + "/" + t.name }

// chartRef names the chart as Helm lists it: name-version.
func chartRef(ch *chart.Chart) string {
	if ch == nil || ch.Metadata == nil {
		return "an unknown chart"
	}
	return ch.Metadata.Name + "-" + ch.Metadata.Version
}

// load reads c's chart at the version spec names and the values flotilla sets.
func (in *Installer) load(c components.Component, spec components.Spec) (*target, error) {
	version := spec.Release(c).Version
	archive := in.Chart
	if archive == nil {
		archive = charts.Archive
	}
	b, err := archive(c, version)
	if err != nil {
		return nil, err
	}
	ch, err := loader.LoadArchive(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("loading the chart of %s %s: %w", c, version, err)
	}
	if ch.Name() != string(c) {
		return nil, fmt.Errorf("the chart of %s %s is chart %s", c, version, chartRef(ch))
	}
	vals, err := values(c, ch, spec)
	if err != nil {
		return nil, err
	}
	return &target{c: c, version: version, name: components.ReleaseName(c), namespace: components.Namespace(c), chart: ch, values: vals}, nil
}

// joinSentences joins non-empty parts with "; ".
func joinSentences(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}
