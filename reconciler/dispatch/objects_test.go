package dispatch

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func gpus(n string) corev1.ResourceList {
	return corev1.ResourceList{"nvidia.com/gpu": resource.MustParse(n), corev1.ResourceCPU: resource.MustParse("100")}
}

func member(id, pool string, registeredAfter time.Duration) Worker {
	return Worker{Key: "acme/" + id, Identity: "4-acme-" + id, Pool: pool, Registered: t0.Add(registeredAfter), Quota: gpus("8")}
}

func find(objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	return nil
}

func names(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName())
	}
	return out
}

func TestBuildGivesEachPoolItsQueueAndOnlyRegisteredClusters(t *testing.T) {
	late := member("late", "eu", time.Hour)
	late.Registered = time.Time{} // not registered yet
	cordoned := member("c", "eu", 2*time.Minute)
	cordoned.Cordoned = true
	tn := Tenant{Name: "acme", Enabled: true, WorkloadNamespaces: []string{"ml", "shared"},
		Workers: []Worker{member("a", "eu", 0), member("b", "us", time.Minute), cordoned, late}}
	l := Build(tn, HubView{Namespaces: map[string]bool{"ml": true}})

	for _, want := range []string{
		"ResourceFlavor//acme.eu", "MultiKueueConfig//4-acme-eu", "AdmissionCheck//acme.eu", "ClusterQueue//acme.eu", "LocalQueue/ml/eu",
		"ClusterQueue//acme.us", "LocalQueue/ml/us", "MultiKueueCluster//4-acme-a", "MultiKueueCluster//4-acme-c", "Namespace//ml",
	} {
		if !slices.Contains(names(l.Objects), want) {
			t.Errorf("no %s in %v", want, names(l.Objects))
		}
	}
	if find(l.Objects, "LocalQueue", "shared", "eu") != nil {
		t.Error("a LocalQueue in a hub namespace the tenant does not own")
	}
	if find(l.Objects, "MultiKueueCluster", "", "4-acme-late") != nil {
		t.Error("an unregistered cluster joined the hub's Kueue")
	}
	clusters, _, _ := unstructured.NestedStringSlice(find(l.Objects, "MultiKueueConfig", "", "4-acme-eu").Object, "spec", "clusters")
	if strings.Join(clusters, ",") != "4-acme-a,4-acme-c" {
		t.Errorf("pool eu holds %v, want a and the cordoned c: a cordon never takes a cluster out", clusters)
	}
	// The cordoned cluster's quota does not count: the hub admits no work for it.
	rgs, _, _ := unstructured.NestedSlice(find(l.Objects, "ClusterQueue", "", "acme.eu").Object, "spec", "resourceGroups")
	if got := fmt.Sprint(rgs); !strings.Contains(got, "nominalQuota:8") || strings.Contains(got, "nominalQuota:16") {
		t.Errorf("acme.eu's quota %s, want a's 8 GPUs alone", got)
	}
	sel, _, _ := unstructured.NestedStringMap(find(l.Objects, "ClusterQueue", "", "acme.eu").Object, "spec", "namespaceSelector", "matchLabels")
	if sel[v1alpha1.TenantLabel] != "acme" {
		t.Errorf("the pool's ClusterQueue admits from %v, want only the tenant's namespaces", sel)
	}
	for _, o := range l.Objects {
		if o.GetLabels()[v1alpha1.TenantLabel] != "acme" || o.GetLabels()[v1alpha1.ManagedByLabel] != v1alpha1.ManagedByValue {
			t.Errorf("%s lacks the tenant's ownership labels: %v", o.GetName(), o.GetLabels())
		}
	}
	if !l.Withdrawn["4-acme-c"] || l.Withdrawn["4-acme-a"] {
		t.Errorf("withdrawn %v, want the cordoned c alone", l.Withdrawn)
	}
	if _, ok := l.Placement["4-acme-late"]; ok {
		t.Error("an unregistered cluster has a placement")
	}
}

func TestAPoolHoldsTheClustersRegisteredFirst(t *testing.T) {
	var ws []Worker
	for i := range 23 {
		// Listed newest first: the order Git lists them in does not matter.
		ws = append(ws, member(fmt.Sprintf("w%02d", i), "eu", time.Duration(23-i)*time.Minute))
	}
	l := Build(Tenant{Name: "acme", Enabled: true, WorkloadNamespaces: []string{"ml"}, Workers: ws}, HubView{Namespaces: map[string]bool{"ml": true}})
	full := 0
	for id, p := range l.Placement {
		if p == v1alpha1.PlacementPoolFull {
			full++
			if n := id[len(id)-2:]; n > "02" {
				t.Errorf("%s, registered early, is left out", id)
			}
		}
	}
	if full != 3 || len(l.Members) != v1alpha1.MaxPoolClusters {
		t.Fatalf("%d left out and %d members, want 3 and %d", full, len(l.Members), v1alpha1.MaxPoolClusters)
	}
}

func TestTenantsNeverShareAHubObject(t *testing.T) {
	a := Build(Tenant{Name: "acme", Enabled: true, WorkloadNamespaces: []string{"ml"}, Workers: []Worker{member("a", "eu", 0)}}, HubView{Namespaces: map[string]bool{"ml": true}})
	b := Build(Tenant{Name: "beta", Enabled: true, WorkloadNamespaces: []string{"ml"}, Workers: []Worker{{Identity: "4-beta-a", Pool: "eu", Registered: t0, Quota: gpus("1")}}}, HubView{Namespaces: map[string]bool{}})
	for _, o := range b.Objects {
		if o.GetKind() == "Namespace" {
			continue // created only when missing, then left alone: not shared, refused
		}
		if find(a.Objects, o.GetKind(), o.GetNamespace(), o.GetName()) != nil {
			t.Errorf("tenants acme and beta both render %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
		}
	}
	if find(b.Objects, "LocalQueue", "ml", "eu") != nil {
		t.Error("beta queues in a namespace acme owns")
	}
}

func TestADisabledFleetPlacesNothing(t *testing.T) {
	l := Build(Tenant{Name: "acme", Enabled: false, WorkloadNamespaces: []string{"ml"}, Workers: []Worker{member("a", "eu", 0)}}, HubView{Namespaces: map[string]bool{"ml": true}})
	if len(l.Objects) != 0 || l.Placement["4-acme-a"] != v1alpha1.PlacementDisabled {
		t.Fatalf("objects %v, placement %v", names(l.Objects), l.Placement)
	}
}

func TestQuotaOfSumsTheClusterQueueBehindTheQueue(t *testing.T) {
	cq := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": map[string]any{"name": "cq"},
		"spec": map[string]any{"resourceGroups": []any{map[string]any{"coveredResources": []any{"nvidia.com/gpu"}, "flavors": []any{
			map[string]any{"name": "a", "resources": []any{map[string]any{"name": "nvidia.com/gpu", "nominalQuota": "8"}}},
			map[string]any{"name": "b", "resources": []any{map[string]any{"name": "nvidia.com/gpu", "nominalQuota": "4"}}},
		}}}}}}
	other := cq.DeepCopy()
	other.SetName("other")
	lq := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": map[string]any{"name": "eu", "namespace": "ml"},
		"spec": map[string]any{"clusterQueue": "cq"}}}
	q := QuotaOf([]*unstructured.Unstructured{other, cq, lq}, "eu")
	if g := q["nvidia.com/gpu"]; g.String() != "12" {
		t.Fatalf("quota %v, want 12 GPUs over both flavors of cq alone", q)
	}
}

// A pool's names are what Kueue accepts for them, and no two pools of different
// tenants share one: not "acme" with "us-eu" and "acme-us" with "eu", not at the longest
// tenant (63) and pool (40), where the MultiKueueConfig's name, a DNS label, is
// shortened with a hash.
func TestPoolNamesAreValidAndNoTwoTenantsShareThem(t *testing.T) {
	long, longer := strings.Repeat("t", 63), strings.Repeat("t", 62)
	pairs := []struct{ a, b [2]string }{
		{[2]string{"acme", "us-eu"}, [2]string{"acme-us", "eu"}},
		{[2]string{"a", "b-c-d"}, [2]string{"a-b-c", "d"}},
		{[2]string{long, strings.Repeat("p", 40)}, [2]string{longer, "t" + strings.Repeat("p", 39)}},
	}
	for _, p := range pairs {
		a, b := PoolNamesOf(p.a[0], p.a[1]), PoolNamesOf(p.b[0], p.b[1])
		if a.Queue == b.Queue || a.Config == b.Config {
			t.Errorf("%v and %v share names: %+v, %+v", p.a, p.b, a, b)
		}
		for _, n := range []PoolNames{a, b} {
			if errs := validation.IsDNS1123Subdomain(n.Queue); len(errs) > 0 {
				t.Errorf("ClusterQueue name %q: %v", n.Queue, errs)
			}
			// The AdmissionCheck names its MultiKueueConfig by a DNS label.
			if errs := validation.IsDNS1123Label(n.Config); len(errs) > 0 {
				t.Errorf("MultiKueueConfig name %q: %v", n.Config, errs)
			}
			if old := oldPoolNames(p.a[0], p.a[1]); n.Queue == old.Queue {
				t.Errorf("new name %q is an old one", n.Queue)
			}
		}
	}
}
