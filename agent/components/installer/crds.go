package installer

import (
	"context"
	"fmt"
	"sort"

	"github.com/fluxcd/pkg/ssa"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// FieldManager is the field manager of what the installer applies itself: the CRDs of a
// chart's crds/ directory.
const FieldManager = components.BinaryName

// applyCRDs server-side applies the CRDs of the chart's crds/ directory (JobSet keeps
// its CRD there), forcing conflicts: Helm installs crds/ once and never upgrades them,
// so without this a JobSet upgrade would run a new controller against the old schema.
// CRDs are never deleted. It returns the CRDs that changed.
func (s *session) applyCRDs(ctx context.Context, ch *chart.Chart) ([]string, error) {
	var changed []string
	c, err := client.New(s.config, client.Options{Mapper: s.mapper})
	if err != nil {
		return nil, fmt.Errorf("applying the CRDs of chart %s: %w", ch.Name(), err)
	}
	// No poller: readiness is the agent's to judge, by what the components answer.
	manager := ssa.NewResourceManager(c, nil, ssa.Owner{Field: FieldManager, Group: "flotilla.dev"})
	for _, file := range ch.CRDObjects() {
		docs := releaseutil.SplitManifests(string(file.File.Data))
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(docs[k]), &u.Object); err != nil {
				return changed, fmt.Errorf("reading %s: %w", file.Filename, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if u.GetKind() != "CustomResourceDefinition" {
				return changed, fmt.Errorf("%s holds a %s, not a CustomResourceDefinition", file.Filename, u.GetKind())
			}
			did, err := applyCRD(ctx, manager, u)
			if err != nil {
				return changed, err
			}
			if did {
				changed = append(changed, u.GetName())
			}
		}
	}
	return changed, nil
}

// applyCRD applies one CRD with fluxcd/pkg/ssa, which writes only what a server-side
// dry run shows would change, and reports whether it changed anything.
func applyCRD(ctx context.Context, manager *ssa.ResourceManager, u *unstructured.Unstructured) (bool, error) {
	anno := u.GetAnnotations()
	if anno == nil {
		anno = map[string]string{}
	}
	anno[InstalledByAnnotation] = components.BinaryName
	u.SetAnnotations(anno)
	entry, err := manager.Apply(ctx, u, ssa.ApplyOptions{})
	if err != nil {
		return false, fmt.Errorf("applying CustomResourceDefinition %s: %w", u.GetName(), err)
	}
	return entry.Action != ssa.UnchangedAction, nil
}
