package dispatch

import (
	"cmp"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// MultiKueueController is the controller name of MultiKueue's admission check.
const MultiKueueController = "kueue.x-k8s.io/multikueue"

// Tenant is what dispatch needs of one tenant's fleet.
type Tenant struct {
	Name string
	// Enabled is fleet.yaml's spec.dispatch.enabled.
	Enabled bool
	// WorkloadNamespaces are where the tenant's jobs are submitted, on the hub as on
	// the workers: fleet.yaml's.
	WorkloadNamespaces []string
	// HubNamespaces are the namespaces on the hub that the hub's configuration gives
	// the tenant. Of its WorkloadNamespaces, the tenant queues on the hub only in
	// these: which tenant owns a namespace is the operator's word, not the first
	// tenant's to sync.
	HubNamespaces []string
	Workers       []Worker
}

// Worker is one cluster of the tenant.
type Worker struct {
	// Key is the WorkerCluster's; Identity its flotilla.dev/worker-cluster value.
	Key      string
	Identity string
	// Pool is the dispatch pool Git puts the cluster in (fleet.PoolOf).
	Pool string
	// Registered is when its agent redeemed the enrollment token; zero until then: a
	// cluster joins the hub's Kueue once registered.
	Registered time.Time
	Cordoned   bool
	// Draining is set for a cluster that left the fleet and still has work placed on it.
	Draining bool
	// Quota is what the worker's ClusterQueue behind the pool's LocalQueue offers.
	Quota corev1.ResourceList
}

// Layout is what Build decides: the hub objects, and where each worker stands.
type Layout struct {
	// Objects are the hub objects of the tenant, except the kubeconfig Secrets, in
	// apply order.
	Objects []*unstructured.Unstructured
	// Placement of each registered worker, by identity.
	Placement map[string]v1alpha1.DispatchPlacement
	// Withdrawn are the members whose quota the pool's ClusterQueue does not count.
	Withdrawn map[string]bool
	// Members are the registered workers in a MultiKueueConfig, by identity: each needs a
	// kubeconfig Secret.
	Members []Worker
}

// KubeConfigSecretName is the Secret in Kueue's namespace holding the kubeconfig of a
// worker's MultiKueueCluster.
func KubeConfigSecretName(identity string) string { return "flotilla-" + identity }

// Build lays out a tenant's hub objects. It is a pure function of Git, of the
// registrations and of what Sync read of the hub, so that the same fleet on the same
// hub always yields the same objects.
func Build(t Tenant, hub HubView) Layout {
	out := Layout{Placement: map[string]v1alpha1.DispatchPlacement{}, Withdrawn: map[string]bool{}}
	if !t.Enabled {
		for _, w := range t.Workers {
			if !w.Registered.IsZero() {
				out.Placement[w.Identity] = v1alpha1.PlacementDisabled
			}
		}
		return out
	}
	pools := poolsOf(t)
	var objs []*unstructured.Unstructured
	for _, pool := range slices.Sorted(maps.Keys(pools)) {
		ws := pools[pool]
		// Registered first, first in: a newer cluster never pushes an older one out.
		slices.SortFunc(ws, func(a, b Worker) int {
			return cmp.Or(a.Registered.Compare(b.Registered), cmp.Compare(a.Identity, b.Identity))
		})
		var members []Worker
		for i, w := range ws {
			if i >= v1alpha1.MaxPoolClusters {
				out.Placement[w.Identity] = v1alpha1.PlacementPoolFull
				continue
			}
			members = append(members, w)
			out.Placement[w.Identity] = v1alpha1.PlacementMember
			out.Withdrawn[w.Identity] = w.Cordoned || w.Draining
			if w.Draining {
				out.Placement[w.Identity] = v1alpha1.PlacementDraining
			}
		}
		out.Members = append(out.Members, members...)
		objs = append(objs, poolObjects(t, pool, members, hub.pool(t.Name, pool), hub.Namespaces)...)
	}
	for _, w := range out.Members {
		objs = append(objs, clusterObject(t.Name, w))
	}
	for _, ns := range t.WorkloadNamespaces {
		if hub.Namespaces[ns] {
			objs = append(objs, namespaceObject(t.Name, ns))
		}
	}
	out.Objects = objs
	return out
}

// poolsOf groups the tenant's registered workers by dispatch pool: the pools that get
// hub objects.
func poolsOf(t Tenant) map[string][]Worker {
	pools := map[string][]Worker{}
	if !t.Enabled {
		return pools
	}
	for _, w := range t.Workers {
		if w.Registered.IsZero() || w.Pool == "" {
			continue
		}
		pools[w.Pool] = append(pools[w.Pool], w)
	}
	return pools
}

// poolObjects are a pool's hub objects, named as view says. Of a refused pool (view
// holds names of others), the objects of those names are left out, its ClusterQueue
// holds, and it gets a LocalQueue only when the ClusterQueue's name is the tenant's.
func poolObjects(t Tenant, pool string, members []Worker, view PoolView, hubNamespaces map[string]bool) []*unstructured.Unstructured {
	name, config := view.Names.Queue, view.Names.Config
	clusters := make([]string, 0, len(members))
	quota := corev1.ResourceList{}
	for _, w := range members {
		clusters = append(clusters, w.Identity)
		// Only dispatchable clusters count: a cordoned or draining one takes no new work,
		// so the hub must not admit work on its account.
		if w.Cordoned || w.Draining {
			continue
		}
		for res, q := range w.Quota {
			sum := quota[res]
			sum.Add(q)
			quota[res] = sum
		}
	}
	slices.Sort(clusters)
	flavor := &kueue.ResourceFlavor{TypeMeta: typeMeta("ResourceFlavor"), ObjectMeta: metav1.ObjectMeta{Name: name}}
	mkc := &kueue.MultiKueueConfig{TypeMeta: typeMeta("MultiKueueConfig"), ObjectMeta: metav1.ObjectMeta{Name: config},
		Spec: kueue.MultiKueueConfigSpec{Clusters: clusters}}
	ac := &kueue.AdmissionCheck{TypeMeta: typeMeta("AdmissionCheck"), ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kueue.AdmissionCheckSpec{ControllerName: MultiKueueController,
			Parameters: &kueue.AdmissionCheckParametersReference{APIGroup: kueue.GroupVersion.Group, Kind: "MultiKueueConfig", Name: config}}}
	resources := slices.Sorted(maps.Keys(quota))
	fq := kueue.FlavorQuotas{Name: kueue.ResourceFlavorReference(name)}
	for _, r := range resources {
		fq.Resources = append(fq.Resources, kueue.ResourceQuota{Name: r, NominalQuota: quota[r]})
	}
	cq := &kueue.ClusterQueue{TypeMeta: typeMeta("ClusterQueue"), ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kueue.ClusterQueueSpec{
			// Only the tenant's own namespaces submit to the tenant's pools.
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.TenantLabel: t.Name}},
			AdmissionChecksStrategy: &kueue.AdmissionChecksStrategy{AdmissionChecks: []kueue.AdmissionCheckStrategyRule{{Name: kueue.AdmissionCheckReference(name)}}},
		}}
	if len(resources) > 0 {
		cq.Spec.ResourceGroups = []kueue.ResourceGroup{{CoveredResources: resources, Flavors: []kueue.FlavorQuotas{fq}}}
	}
	held := map[string]bool{}
	for _, h := range view.Held {
		held[h.Kind] = true
	}
	if len(held) > 0 {
		// Refused: it may name another's AdmissionCheck, and so reach another tenant's
		// workers. Holding admits nothing new and lets admitted work run on.
		hold := kueue.Hold
		cq.Spec.StopPolicy = &hold
	}
	var objs []*unstructured.Unstructured
	for _, o := range []runtime.Object{flavor, mkc, ac, cq} {
		if !held[o.GetObjectKind().GroupVersionKind().Kind] {
			objs = append(objs, owned(t.Name, o))
		}
	}
	if held["ClusterQueue"] {
		return objs // a LocalQueue of the tenant's would feed someone else's queue
	}
	for _, ns := range t.WorkloadNamespaces {
		if !hubNamespaces[ns] {
			continue // not given to the tenant, or another's on the hub: not ours to queue in
		}
		lq := &kueue.LocalQueue{TypeMeta: typeMeta("LocalQueue"), ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool},
			Spec: kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(name)}}
		objs = append(objs, owned(t.Name, lq))
	}
	return objs
}

func clusterObject(tenant string, w Worker) *unstructured.Unstructured {
	mc := &kueue.MultiKueueCluster{TypeMeta: typeMeta("MultiKueueCluster"), ObjectMeta: metav1.ObjectMeta{Name: w.Identity},
		Spec: kueue.MultiKueueClusterSpec{ClusterSource: kueue.ClusterSource{KubeConfig: &kueue.KubeConfig{
			LocationType: kueue.SecretLocationType, Location: KubeConfigSecretName(w.Identity)}}}}
	u := owned(tenant, mc)
	labels := u.GetLabels()
	labels[v1alpha1.WorkerClusterLabel] = w.Identity
	u.SetLabels(labels)
	return u
}

// namespaceObject is a workload namespace on the hub: created for the tenant when
// missing, never updated or pruned once it exists.
func namespaceObject(tenant, name string) *unstructured.Unstructured {
	ns := &corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{v1alpha1.ApplyAnnotation: v1alpha1.ApplyIfNotPresent, v1alpha1.PruneAnnotation: v1alpha1.PruneDisabled}}}
	return owned(tenant, ns)
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: kind}
}

// owned converts obj and labels it as the tenant's.
func owned(tenant string, obj runtime.Object) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		panic(err) // typed Kueue and core objects always convert
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	u.SetLabels(map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.TenantLabel: tenant})
	return u
}

// QuotaOf is the nominal quota a worker's desired state offers behind the LocalQueue
// named queue: the sum over the flavors of the ClusterQueue it feeds.
func QuotaOf(objects []*unstructured.Unstructured, queue string) corev1.ResourceList {
	var cqName string
	for _, o := range objects {
		if o.GetKind() == "LocalQueue" && o.GetName() == queue {
			cqName, _, _ = unstructured.NestedString(o.Object, "spec", "clusterQueue")
			break
		}
	}
	out := corev1.ResourceList{}
	for _, o := range objects {
		if o.GetKind() != "ClusterQueue" || o.GetName() != cqName {
			continue
		}
		var cq kueue.ClusterQueue
		if runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cq) != nil {
			return out
		}
		return NominalQuota(&cq)
	}
	return out
}

// NominalQuota sums a ClusterQueue's nominal quota by resource over its flavors.
func NominalQuota(cq *kueue.ClusterQueue) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, rg := range cq.Spec.ResourceGroups {
		for _, f := range rg.Flavors {
			for _, r := range f.Resources {
				sum := out[r.Name]
				sum.Add(r.NominalQuota)
				out[r.Name] = sum
			}
		}
	}
	return out
}
