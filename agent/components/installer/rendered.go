package installer

import (
	"fmt"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// Rendered is what installing c at version from the charts embedded in this build
// writes: the chart's templates rendered with the values the installer sets (the
// release image from registry.k8s.io, the integrations batch/job and JobSet), and the
// CRDs of its crds/. A namespaced object the chart leaves without a namespace is in
// components.Namespace(c), where Helm puts it; a cluster-scoped one has none, whatever
// the chart writes (Kueue's webhook configurations name one).
//
// It is the one source of what the installer may write on a worker: RBAC.md, the
// agent's chart (the installer's roles and its admission policy) and their tests are
// checked against it, so that a chart version that renders something new fails their
// tests until they allow it. What it returns for roles and bindings does not depend on
// the values the installer sets.
func Rendered(c components.Component, version string) ([]*unstructured.Unstructured, error) {
	in := &Installer{}
	spec := components.Spec{Managed: true, Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset"}}
	switch c {
	case components.Kueue:
		spec.Kueue.Version = version
	case components.JobSet:
		spec.JobSet.Version = version
	}
	tgt, err := in.load(c, spec)
	if err != nil {
		return nil, err
	}
	top, err := chartutil.ToRenderValues(tgt.chart, tgt.values, common.ReleaseOptions{Name: tgt.name, Namespace: tgt.namespace, IsInstall: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("rendering %s %s: %w", c, version, err)
	}
	files, err := engine.Render(tgt.chart, top)
	if err != nil {
		return nil, fmt.Errorf("rendering %s %s: %w", c, version, err)
	}
	// In a stable order, so that what is derived from it is too.
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.HasSuffix(name, ".yaml") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	texts := make([]string, 0, len(names))
	for _, name := range names {
		texts = append(texts, files[name])
	}
	for _, crd := range tgt.chart.CRDObjects() {
		texts = append(texts, string(crd.File.Data))
	}
	var out []*unstructured.Unstructured
	for _, text := range texts {
		docs := releaseutil.SplitManifests(text)
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(docs[k]), &m); err != nil {
				return nil, fmt.Errorf("rendering %s %s: %w", c, version, err)
			}
			if len(m) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: m}
			switch {
			case clusterScoped(u.GetKind()):
				u.SetNamespace("")
			case u.GetNamespace() == "":
				u.SetNamespace(tgt.namespace)
			}
			out = append(out, u)
		}
	}
	return out, nil
}

// clusterScoped says whether kind, one the charts render, is cluster-scoped; any other
// kind is taken as namespaced, and RBAC.md's test then finds it does not cover it.
func clusterScoped(kind string) bool {
	switch kind {
	case "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
		"ValidatingWebhookConfiguration", "APIService", "Namespace", "PriorityClass":
		return true
	}
	return false
}
