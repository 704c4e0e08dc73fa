package installer

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	release "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/resource"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// Helm's marks of ownership on the objects of a release.
const (
	helmManagedByLabel        = "app.kubernetes.io/managed-by"
	helmManagedByValue        = "Helm"
	helmReleaseNameAnnotation = "meta.helm.sh/release-name"
	helmReleaseNSAnnotation   = "meta.helm.sh/release-namespace"
)

// keyCRD is the CRD whose presence says a component is installed.
var keyCRD = map[components.Component]string{
	components.Kueue:  "clusterqueues.kueue.x-k8s.io",
	components.JobSet: "jobsets.jobset.x-k8s.io",
}

// foundObject is an object the chart would create that exists already.
type foundObject struct {
	kind, namespace, name string
	created               time.Time
	// helmRelease is namespace/name of the Helm release the object says it belongs
	// to, empty when it was not installed by Helm.
	helmRelease string
}

func (o foundObject) String() string {
	return fmt.Sprintf("%s (created %s)", objectRef(o.kind, o.namespace, o.name), o.created.UTC().Format(time.RFC3339))
}

// objectRef names an object as kubectl would show it: Kind namespace/name, or Kind name
// when it is cluster-scoped.
func objectRef(kind, namespace, name string) string {
	if namespace == "" {
		return kind + " " + name
	}
	return kind + " " + namespace + "/" + name
}

// brownfield is what a run found of a component that flotilla did not install.
type brownfield struct {
	// release is a Helm release under flotilla's name that flotilla did not make.
	release *release.Release
	found   []foundObject
}

func (b brownfield) empty() bool { return b.release == nil && len(b.found) == 0 }

// scan looks for what t's chart would create, when no release of flotilla's exists:
// every object of the rendered chart and of its crds/. An object carrying the
// installer's mark (a CRD kept from an earlier release of flotilla's) is flotilla's own
// and not counted. last is the release under flotilla's name, if someone else made one.
func (s *session) scan(ctx context.Context, hc *action.Configuration, t *target, last *release.Release) (brownfield, error) {
	b := brownfield{release: last}
	// A server-side dry run renders the chart with the worker's capabilities and
	// writes nothing. TakeOwnership keeps Helm's own ownership check from ending the
	// dry run at the first object someone else owns: this scan reports them all.
	in := action.NewInstall(hc)
	in.ReleaseName, in.Namespace = t.name, t.namespace
	in.DryRunStrategy = action.DryRunServer
	in.TakeOwnership = true
	in.SkipCRDs = true
	in.PostRenderer = keepCRDs{}
	in.DisableOpenAPIValidation = true
	r, err := in.RunWithContext(ctx, t.chart, t.values)
	if err != nil {
		return b, fmt.Errorf("rendering chart %s to look for an earlier installation: %w", chartRef(t.chart), err)
	}
	rel, err := asV1(r)
	if err != nil {
		return b, err
	}
	var manifests bytes.Buffer
	for _, crd := range t.chart.CRDObjects() {
		manifests.WriteString("\n---\n")
		manifests.Write(crd.File.Data)
	}
	manifests.WriteString("\n---\n")
	manifests.WriteString(rel.Manifest)
	infos, err := hc.KubeClient.Build(&manifests, false)
	if err != nil {
		return b, fmt.Errorf("reading chart %s's objects: %w", chartRef(t.chart), err)
	}
	for _, info := range infos {
		if err := ctx.Err(); err != nil {
			return b, err
		}
		obj, err := resource.NewHelper(info.Client, info.Mapping).Get(info.Namespace, info.Name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return b, fmt.Errorf("looking for %s: %w", objectRef(info.Mapping.GroupVersionKind.Kind, info.Namespace, info.Name), err)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return b, err
		}
		if m.GetAnnotations()[InstalledByAnnotation] == components.BinaryName {
			continue
		}
		o := foundObject{kind: info.Mapping.GroupVersionKind.Kind, namespace: info.Namespace, name: info.Name, created: m.GetCreationTimestamp().Time}
		if m.GetLabels()[helmManagedByLabel] == helmManagedByValue {
			if name := m.GetAnnotations()[helmReleaseNameAnnotation]; name != "" {
				o.helmRelease = m.GetAnnotations()[helmReleaseNSAnnotation] + "/" + name
			}
		}
		b.found = append(b.found, o)
	}
	// The objects that say most about what was found come first: the component's key
	// CRD, then its controller's Deployment; the rest keep the chart's order.
	rank := func(o foundObject) int {
		switch {
		case o.kind == "CustomResourceDefinition" && o.name == keyCRD[t.c]:
			return 0
		case o.kind == "Deployment":
			return 1
		}
		return 2
	}
	slices.SortStableFunc(b.found, func(x, y foundObject) int { return cmp.Compare(rank(x), rank(y)) })
	return b, nil
}

// origin says who installed what was found.
func (b brownfield) origin(t *target) string {
	if b.release != nil {
		return fmt.Sprintf("installed by Helm release %s (chart %s, revision %d, %s %s), which flotilla did not make",
			t.release(), chartRef(b.release.Chart), b.release.Version, b.release.Info.Status, b.release.Info.LastDeployed.UTC().Format(time.RFC3339))
	}
	var owners []string
	for _, o := range b.found {
		w := "without Helm"
		if o.helmRelease != "" {
			w = "by Helm release " + o.helmRelease
		}
		if !slices.Contains(owners, w) {
			owners = append(owners, w)
		}
	}
	return "installed " + strings.Join(owners, " and ")
}

// objects names the first objects found and counts the rest.
func (b brownfield) objects() string {
	const shown = 2
	if len(b.found) == 0 {
		return "none of its objects found"
	}
	var names []string
	for _, o := range b.found[:min(shown, len(b.found))] {
		names = append(names, o.String())
	}
	s := "found " + strings.Join(names, ", ")
	if more := len(b.found) - shown; more > 0 {
		s += fmt.Sprintf(" and %d more of the chart's objects", more)
	}
	return s
}

// refusal tells the cluster's platform team what is there and how to hand it over.
func (b brownfield) refusal(t *target) string {
	return fmt.Sprintf("%s is already on this worker, %s: %s; flotilla changed nothing. "+
		"To hand it over, set spec.components.adopt: true in the cluster's cluster.yaml (flotilla then takes it over once, keeping its objects and their UIDs); "+
		"to keep running it yourselves, set spec.components.managed: false",
		t.c, b.origin(t), b.objects())
}

// cannotAdopt says why what was found cannot be adopted, or "" when it can: objects of
// a Helm release under another name or namespace belong to a release that keeps
// running its own controller, and taking over its CRDs would put a second controller
// beside it.
func (b brownfield) cannotAdopt(t *target) string {
	for _, o := range b.found {
		if o.helmRelease != "" && o.helmRelease != t.release() {
			return fmt.Sprintf("%s is already on this worker, installed by Helm release %s: found %s; flotilla changed nothing. "+
				"Adoption takes over what was installed without Helm or by a Helm release named %s in namespace %s; a release elsewhere would keep its own controller beside flotilla's. "+
				"Remove that release's controller first, or set spec.components.managed: false to keep running it yourselves",
				t.c, o.helmRelease, o, t.name, t.namespace)
		}
	}
	return ""
}
