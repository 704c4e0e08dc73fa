package dispatch

import (
	"maps"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// The dispatcher holds a little of each worker it dispatches to: its WorkerCluster's
// key, the newest judgement of Kueue's it recorded, the connection it had Kueue try
// again for. A cluster gone from its tenant takes that with it, and one back is read
// afresh, as Kueue may have judged it while the dispatcher did not know it.
func TestTheDispatcherForgetsWorkersTheirTenantNoLongerHas(t *testing.T) {
	d := newDispatcher(Options{})
	wcs := func(tenant string, names ...string) map[string]*v1alpha1.WorkerCluster {
		m := map[string]*v1alpha1.WorkerCluster{}
		for _, n := range names {
			m[tenant+"."+n] = &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: n}}
		}
		return m
	}
	held := func() (keys, judged, redialled []string) {
		return slices.Sorted(maps.Keys(d.keys)), slices.Sorted(maps.Keys(d.judged)), slices.Sorted(maps.Keys(d.redialled))
	}
	steps := []struct {
		name   string
		tenant string
		wcs    map[string]*v1alpha1.WorkerCluster
		fresh  []string
		keys   []string
	}{
		{"a tenant's first Sync knows none of its workers", "a", wcs("a", "x", "y"), []string{"a.x", "a.y"}, []string{"a.x", "a.y"}},
		{"another tenant's workers are its own", "b", wcs("b", "z"), []string{"b.z"}, []string{"a.x", "a.y", "b.z"}},
		{"a worker gone from its tenant is forgotten", "a", wcs("a", "x"), nil, []string{"a.x", "b.z"}},
		{"the same workers again are nothing new", "a", wcs("a", "x"), nil, []string{"a.x", "b.z"}},
		{"a worker back in its tenant is new again", "a", wcs("a", "x", "y"), []string{"a.y"}, []string{"a.x", "a.y", "b.z"}},
		{"a tenant with no workers left forgets them all", "a", nil, nil, []string{"b.z"}},
	}
	for _, s := range steps {
		fresh := d.remember(s.tenant, s.wcs)
		if got := slices.Sorted(maps.Keys(fresh)); !slices.Equal(got, s.fresh) {
			t.Errorf("%s: new identities %q, want %q", s.name, got, s.fresh)
		}
		// Of the new ones, nothing was recorded yet.
		old := slices.DeleteFunc(slices.Clone(s.keys), func(id string) bool { return fresh[id] })
		keys, judged, redialled := held()
		if !slices.Equal(keys, s.keys) || !slices.Equal(judged, old) || !slices.Equal(redialled, old) {
			t.Errorf("%s: holds the keys of %q, judgements of %q and redials of %q; want the keys of %q, the others of %q",
				s.name, keys, judged, redialled, s.keys, old)
		}
		// What Judged and Redial record of every worker the dispatcher knows, and a
		// redial of a WorkerCluster no Sync has handed it.
		for id := range d.keys {
			d.judged[id] = "1"
			d.redialled[id] = "2026-12-06T00:00:00Z"
		}
		d.redialled["c.unknown"] = "2026-12-06T00:00:00Z"
	}
}
