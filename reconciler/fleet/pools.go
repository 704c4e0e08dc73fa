package fleet

import (
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// maxPoolName bounds a pool's name, so that with its tenant it names the hub's objects
// of the pool (reconciler/dispatch PoolNamesOf) within the lengths Kueue allows.
const maxPoolName = 40

// PoolOf names the dispatch pool Git puts a cluster in: the pool of fleet.yaml that
// lists it, or else the pool named after its residency. The error says why the cluster
// can be in no pool; it is the cluster's error, not the fleet's. Only Git decides: a
// cluster moves between pools only when a commit moves it, since a move makes Kueue
// requeue its running work.
func PoolOf(spec *v1alpha1.FleetSpec, name, residency string) (string, error) {
	var pools []v1alpha1.DispatchPool
	if spec.Dispatch != nil {
		pools = spec.Dispatch.Pools
	}
	for _, p := range pools {
		if slices.Contains(p.Clusters, name) {
			if p.Residency != residency {
				return "", fmt.Errorf("fleet.yaml puts this cluster in dispatch pool %q of residency %q, but its residency is %q: a pool's jobs never leave its residency", p.Name, p.Residency, residency)
			}
			return p.Name, nil
		}
	}
	if i := slices.IndexFunc(pools, func(p v1alpha1.DispatchPool) bool { return p.Name == residency }); i >= 0 && pools[i].Residency != residency {
		return "", fmt.Errorf("a cluster that no dispatch pool lists joins the pool named after its residency %q, but fleet.yaml declares that pool for residency %q: list this cluster in a pool", residency, pools[i].Residency)
	}
	if msgs := validation.IsDNS1123Label(residency); len(msgs) > 0 || len(residency) > maxPoolName {
		return "", fmt.Errorf("residency %q cannot name a dispatch pool (a DNS label of at most %d characters): list this cluster in a pool of fleet.yaml", residency, maxPoolName)
	}
	return residency, nil
}

// validateDispatch checks fleet.yaml's dispatch section.
func validateDispatch(d *v1alpha1.DispatchSpec, at func(path ...string) *yaml.Node, e errs) {
	if d == nil {
		return
	}
	if d.DrainGracePeriod != nil && d.DrainGracePeriod.Duration < 0 {
		n := at("dispatch", "drainGracePeriod")
		e.at(n.Line, n.Column, "spec.dispatch.drainGracePeriod may not be negative")
	}
	names := map[string]bool{}
	member := map[string]string{}
	for i, p := range d.Pools {
		idx := fmt.Sprintf("[%d]", i)
		if msgs := validation.IsDNS1123Label(p.Name); len(msgs) > 0 || len(p.Name) > maxPoolName {
			n := at("dispatch", "pools", idx, "name")
			e.at(n.Line, n.Column, "dispatch pool name %q must be a DNS label of at most %d characters", p.Name, maxPoolName)
		}
		if names[p.Name] {
			n := at("dispatch", "pools", idx, "name")
			e.at(n.Line, n.Column, "dispatch pool %q is declared twice", p.Name)
		}
		names[p.Name] = true
		if p.Residency == "" {
			n := at("dispatch", "pools", idx, "residency")
			e.at(n.Line, n.Column, "dispatch pool %q needs a residency", p.Name)
		}
		if len(p.Clusters) > v1alpha1.MaxPoolClusters {
			n := at("dispatch", "pools", idx, "clusters")
			e.at(n.Line, n.Column, "dispatch pool %q lists %d clusters; Kueue takes at most %d in one pool: split it", p.Name, len(p.Clusters), v1alpha1.MaxPoolClusters)
		}
		for j, c := range p.Clusters {
			if other, ok := member[c]; ok {
				n := at("dispatch", "pools", idx, "clusters", fmt.Sprintf("[%d]", j))
				e.at(n.Line, n.Column, "cluster %q is in dispatch pools %q and %q; a cluster is in one pool", c, other, p.Name)
			}
			member[c] = p.Name
		}
	}
}
