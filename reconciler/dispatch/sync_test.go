package dispatch

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/test/forge"
	"github.com/flotilla-gitops/flotilla/test/logtest"
)

// testHub is the hub plane with a dispatcher as the hub runs it: the tunnel's proxy
// tokens, a status writer of the WorkerClusters. Kueue's manager does not run: what
// these tests pin is which objects the tenants get, not what Kueue makes of them.
type testHub struct {
	t      *testing.T
	c      client.Client
	status *conditions.Writer
	d      *Dispatcher
	logs   *logtest.Buffer
}

func newTestHub(t *testing.T) *testHub {
	t.Helper()
	c := planes[0].Client
	status := conditions.NewWriter(c)
	tun, err := tunnel.New(tunnel.Options{Client: c, Status: status, AllowInsecureLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tun.Close)
	h := &testHub{t: t, c: c, status: status, logs: &logtest.Buffer{Max: 64 << 10}}
	h.d, err = New(Options{Client: c, Tokens: tun, ProxyURL: "https://127.0.0.1:9443", ProxyPath: tunnel.ProxyURL,
		Trust: func() []byte { return []byte("the proxy's CA") }, Status: status, Log: h.logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the dispatcher's log:\n%s", h.logs.Last(16<<10))
		}
	})
	h.namespace(DefaultKueueNamespace, "")
	return h
}

// namespace makes sure the hub namespace exists, labelled for tenant unless empty.
func (h *testHub) namespace(name, tenant string) {
	h.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if tenant != "" {
		ns.Labels = map[string]string{v1alpha1.TenantLabel: tenant}
	}
	if err := h.c.Create(h.t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		h.t.Fatal(err)
	}
}

// tenant is a tenant whose fleet.yaml names the workload namespaces workloads, to
// which the hub's configuration gives given, with one registered worker per pool.
// What the hub holds of it is removed when the test ends.
func (h *testHub) tenant(name string, workloads, given []string, pools ...string) (Tenant, map[string]*v1alpha1.WorkerCluster) {
	h.t.Helper()
	ctx := h.t.Context()
	tn := Tenant{Name: name, Enabled: true, WorkloadNamespaces: workloads, HubNamespaces: given}
	wcs := map[string]*v1alpha1.WorkerCluster{}
	ns := "tenant-" + name
	h.namespace(ns, "")
	for _, pool := range pools {
		worker := "gpu-" + pool
		id := fleet.Identity(name, worker)
		wc := &v1alpha1.WorkerCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: worker,
			Labels: map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: id}},
			Spec: v1alpha1.WorkerClusterSpec{Region: "r", Residency: pool, Preset: "gpu"}}
		if err := h.c.Create(ctx, wc); err != nil && !apierrors.IsAlreadyExists(err) {
			h.t.Fatal(err)
		}
		key := client.ObjectKeyFromObject(wc)
		stored, err := h.status.Record(ctx, key, conditions.Redeemed{TokenHash: "sha256:" + strings.Repeat("ab", 32), At: t0})
		if err != nil {
			h.t.Fatal(err)
		}
		wcs[id] = stored
		tn.Workers = append(tn.Workers, WorkerOf(stored, pool, gpus("8"), false))
	}
	h.t.Cleanup(func() { h.remove(name, workloads) })
	return tn, wcs
}

// remove deletes what the hub holds labelled for tenant, so that a test after it finds
// the names free. Kueue's manager does not run, so nothing holds a deletion up.
func (h *testHub) remove(tenant string, namespaces []string) {
	// Cleanups run once the test's context has ended.
	ctx := context.Background()
	mine := client.MatchingLabels{v1alpha1.TenantLabel: tenant}
	for _, kind := range []string{"ResourceFlavor", "MultiKueueConfig", "AdmissionCheck", "ClusterQueue", "MultiKueueCluster"} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(kueue.GroupVersion.WithKind(kind))
		if err := h.c.DeleteAllOf(ctx, u, mine); err != nil {
			h.t.Errorf("removing tenant %s's %ss: %v", tenant, kind, err)
		}
	}
	for _, ns := range namespaces {
		if err := h.c.DeleteAllOf(ctx, &kueue.LocalQueue{}, client.InNamespace(ns), mine); err != nil {
			h.t.Errorf("removing tenant %s's LocalQueues of %s: %v", tenant, ns, err)
		}
	}
	if err := h.c.DeleteAllOf(ctx, &corev1.Secret{}, client.InNamespace(DefaultKueueNamespace), mine); err != nil {
		h.t.Errorf("removing tenant %s's kubeconfigs: %v", tenant, err)
	}
}

// create makes the objects a hub before this one applied, as it labelled them; the
// namespaces are made apart (testHub.namespace).
func (h *testHub) create(objs []*unstructured.Unstructured) {
	h.t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		if err := h.c.Create(h.t.Context(), o.DeepCopy()); err != nil {
			h.t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// sync syncs the tenant as the hub does and returns what it refused; any error fails
// the test.
func (h *testHub) sync(t Tenant, wcs map[string]*v1alpha1.WorkerCluster) *Report {
	h.t.Helper()
	rep, err := h.d.Sync(h.t.Context(), t, wcs)
	if err != nil {
		h.t.Fatalf("syncing tenant %s: %v", t.Name, err)
	}
	return rep
}

// get is the cluster-scoped Kueue object kind/name, nil when there is none.
func (h *testHub) get(kind, name string) *unstructured.Unstructured {
	h.t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(kueue.GroupVersion.WithKind(kind))
	err := h.c.Get(h.t.Context(), client.ObjectKey{Name: name}, u)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return u
}

// queueOf is the ClusterQueue of the LocalQueue ns/name and the tenant it is labelled
// for; empty when there is no such LocalQueue.
func (h *testHub) queueOf(ns, name string) (clusterQueue, tenant string) {
	h.t.Helper()
	var lq kueue.LocalQueue
	err := h.c.Get(h.t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &lq)
	if apierrors.IsNotFound(err) {
		return "", ""
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return string(lq.Spec.ClusterQueue), lq.Labels[v1alpha1.TenantLabel]
}

// hasPool checks that the tenant's pool has all its objects, named as names says and
// labelled as the tenant's, its ClusterQueue admits, and its LocalQueue in ns feeds it.
func (h *testHub) hasPool(tenant, pool, ns string, names PoolNames) {
	h.t.Helper()
	for _, o := range []struct{ kind, name string }{
		{"ResourceFlavor", names.Queue}, {"MultiKueueConfig", names.Config}, {"AdmissionCheck", names.Queue}, {"ClusterQueue", names.Queue},
	} {
		u := h.get(o.kind, o.name)
		if u == nil {
			h.t.Errorf("tenant %s's pool %s has no %s %s", tenant, pool, o.kind, o.name)
			continue
		}
		if owner := u.GetLabels()[v1alpha1.TenantLabel]; owner != tenant {
			h.t.Errorf("%s %s of tenant %s's pool %s is labelled for tenant %q", o.kind, o.name, tenant, pool, owner)
		}
	}
	if ac := h.get("AdmissionCheck", names.Queue); ac != nil {
		if config, _, _ := unstructured.NestedString(ac.Object, "spec", "parameters", "name"); config != names.Config {
			h.t.Errorf("AdmissionCheck %s names MultiKueueConfig %q, want %q", names.Queue, config, names.Config)
		}
	}
	if cq := h.get("ClusterQueue", names.Queue); cq != nil {
		if stop, _, _ := unstructured.NestedString(cq.Object, "spec", "stopPolicy"); stop != "" && stop != string(kueue.None) {
			h.t.Errorf("ClusterQueue %s of tenant %s's pool %s holds (stopPolicy %s)", names.Queue, tenant, pool, stop)
		}
	}
	if cq, owner := h.queueOf(ns, pool); cq != names.Queue || owner != tenant {
		h.t.Errorf("LocalQueue %s/%s feeds ClusterQueue %q and is labelled for tenant %q; want %q of tenant %s", ns, pool, cq, owner, names.Queue, tenant)
	}
}

// refusedNothing checks that rep refuses the tenant nothing.
func refusedNothing(t *testing.T, tenant string, rep *Report) {
	t.Helper()
	if rep == nil || len(rep.Refused) > 0 || len(rep.NotGiven) > 0 || len(rep.Taken) > 0 {
		t.Errorf("tenant %s: refused %+v, want nothing refused", tenant, rep)
	}
}

// Tenant "acme" with pool "us-eu" and tenant "acme-us" with pool "eu" once claimed the
// same four hub objects, acme-us-eu: whichever synced second was refused for good, and
// its jobs never admitted. Each now gets its own, whichever syncs first.
func TestTenantsWhoseOldNamesCollideEachGetTheirPoolWhicheverSyncsFirst(t *testing.T) {
	for _, first := range []string{"acme", "acme-us"} {
		t.Run(first+" first", func(t *testing.T) {
			h := newTestHub(t)
			acme, acmeWCs := h.tenant("acme", []string{"ml-acme"}, []string{"ml-acme"}, "us-eu")
			acmeUS, acmeUSWCs := h.tenant("acme-us", []string{"ml-acme-us"}, []string{"ml-acme-us"}, "eu")
			reports := map[string]*Report{}
			order := []string{"acme", "acme-us"}
			if first != "acme" {
				slices.Reverse(order)
			}
			for _, name := range order {
				if name == "acme" {
					reports[name] = h.sync(acme, acmeWCs)
				} else {
					reports[name] = h.sync(acmeUS, acmeUSWCs)
				}
			}
			for name, rep := range reports {
				refusedNothing(t, name, rep)
			}
			if a, b := PoolNamesOf("acme", "us-eu"), PoolNamesOf("acme-us", "eu"); a.Queue == b.Queue || a.Config == b.Config {
				t.Fatalf("the pools share names: %+v and %+v", a, b)
			}
			h.hasPool("acme", "us-eu", "ml-acme", PoolNamesOf("acme", "us-eu"))
			h.hasPool("acme-us", "eu", "ml-acme-us", PoolNamesOf("acme-us", "eu"))
		})
	}
}

// A hub before this one named every object of a pool <tenant>-<pool>. A pool whose
// ClusterQueue the tenant holds under that name keeps every name: the work admitted
// there records them, and a LocalQueue's ClusterQueue cannot change. The tenant's new
// pools, and the pool of the tenant those old names shut out, get unambiguous names.
func TestAnUpgradeKeepsTheOldNamesOfThePoolsThatHaveThem(t *testing.T) {
	h := newTestHub(t)
	acme, acmeWCs := h.tenant("acme", []string{"ml-upgrade"}, []string{"ml-upgrade"}, "us-eu", "us")
	acmeUS, acmeUSWCs := h.tenant("acme-us", []string{"ml-upgrade-us"}, []string{"ml-upgrade-us"}, "eu")
	// What the hub before left: acme's pool us-eu, under acme-us-eu, which refused the
	// pool eu of acme-us. Pool us is new.
	h.namespace("ml-upgrade", "acme")
	before := acme
	before.Workers = slices.DeleteFunc(slices.Clone(acme.Workers), func(w Worker) bool { return w.Pool != "us-eu" })
	old := oldPoolNames("acme", "us-eu")
	h.create(Build(before, HubView{Namespaces: map[string]bool{"ml-upgrade": true}, Pools: map[string]PoolView{"us-eu": {Names: old}}}).Objects)
	cq, lq := h.get("ClusterQueue", old.Queue), &kueue.LocalQueue{}
	if err := h.c.Get(t.Context(), client.ObjectKey{Namespace: "ml-upgrade", Name: "us-eu"}, lq); err != nil {
		t.Fatal(err)
	}

	refusedNothing(t, "acme", h.sync(acme, acmeWCs))
	refusedNothing(t, "acme-us", h.sync(acmeUS, acmeUSWCs))

	h.hasPool("acme", "us-eu", "ml-upgrade", old)
	if now := h.get("ClusterQueue", old.Queue); now == nil || now.GetUID() != cq.GetUID() {
		t.Errorf("ClusterQueue %s, under which work was admitted, was replaced: %v", old.Queue, now)
	}
	var lqNow kueue.LocalQueue
	if err := h.c.Get(t.Context(), client.ObjectKeyFromObject(lq), &lqNow); err != nil || lqNow.UID != lq.UID {
		t.Errorf("LocalQueue ml-upgrade/us-eu was replaced (%v)", err)
	}
	if h.get("ClusterQueue", PoolNamesOf("acme", "us-eu").Queue) != nil {
		t.Errorf("pool us-eu, which keeps its old names, also got ClusterQueue %s", PoolNamesOf("acme", "us-eu").Queue)
	}
	h.hasPool("acme", "us", "ml-upgrade", PoolNamesOf("acme", "us"))
	h.hasPool("acme-us", "eu", "ml-upgrade-us", PoolNamesOf("acme-us", "eu"))
}

// The new names are no two tenants' pools', but a tenant named by digits alone had
// pools named <tenant>-<pool> before, which may be another tenant's pool's
// MultiKueueConfig's name now: tenant "4"'s pool "acme-us-eu" held 4-acme-us-eu, the
// name of tenant "acme"'s pool "us-eu"'s. The pool refused is the one whose name
// something else holds on the hub, whichever tenant syncs first; the refusal says which
// object is whose, and the tenant's other pool is unaffected.
func TestAPoolWhoseNameAnotherTenantHoldsIsRefusedWhicheverSyncsFirst(t *testing.T) {
	for _, first := range []string{"acme", "4"} {
		t.Run(first+" first", func(t *testing.T) {
			h := newTestHub(t)
			acme, acmeWCs := h.tenant("acme", []string{"ml-acme"}, []string{"ml-acme"}, "us-eu", "eu")
			four, fourWCs := h.tenant("4", []string{"ml-4"}, []string{"ml-4"}, "acme-us-eu")
			h.namespace("ml-4", "4")
			old := oldPoolNames("4", "acme-us-eu")
			if old.Config != PoolNamesOf("acme", "us-eu").Config {
				t.Fatalf("the test's premise: %s is not acme's pool us-eu's MultiKueueConfig, %s", old.Config, PoolNamesOf("acme", "us-eu").Config)
			}
			h.create(Build(four, HubView{Namespaces: map[string]bool{"ml-4": true}, Pools: map[string]PoolView{"acme-us-eu": {Names: old}}}).Objects)
			held := h.get("MultiKueueConfig", old.Config)

			reports := map[string]*Report{}
			order := []string{"acme", "4"}
			if first != "acme" {
				slices.Reverse(order)
			}
			for _, name := range order {
				if name == "acme" {
					reports[name] = h.sync(acme, acmeWCs)
				} else {
					reports[name] = h.sync(four, fourWCs)
				}
			}

			refusedNothing(t, "4", reports["4"])
			h.hasPool("4", "acme-us-eu", "ml-4", old)
			now := h.get("MultiKueueConfig", old.Config)
			clusters, _, _ := unstructured.NestedStringSlice(now.Object, "spec", "clusters")
			if now.GetUID() != held.GetUID() || !slices.Equal(clusters, slices.Collect(maps.Keys(fourWCs))) {
				t.Errorf("tenant 4's MultiKueueConfig %s was replaced or holds %v", old.Config, clusters)
			}

			rep := reports["acme"]
			if rep == nil || !slices.Equal(slices.Sorted(maps.Keys(rep.Refused)), []string{"us-eu"}) {
				t.Fatalf("acme's refused pools: %+v, want us-eu alone", rep)
			}
			msg := rep.Refused["us-eu"].Error()
			for _, want := range []string{"dispatch pool us-eu", "MultiKueueConfig 4-acme-us-eu", "tenant 4's"} {
				if !strings.Contains(msg, want) {
					t.Errorf("the refusal %q does not say %q", msg, want)
				}
			}
			h.hasPool("acme", "eu", "ml-acme", PoolNamesOf("acme", "eu"))
			// The refused pool admits nothing: its AdmissionCheck would name another
			// tenant's MultiKueueConfig. Jobs submitted to its LocalQueue wait.
			cq := h.get("ClusterQueue", PoolNamesOf("acme", "us-eu").Queue)
			if stop, _, _ := unstructured.NestedString(cq.Object, "spec", "stopPolicy"); stop != string(kueue.Hold) {
				t.Errorf("the refused pool's ClusterQueue has stopPolicy %q, want Hold", stop)
			}
			if log := h.logs.String(); !strings.Contains(log, "the pool is refused") || !strings.Contains(log, "pool=us-eu") {
				t.Error("the refusal is not in the hub's log")
			}
		})
	}
}

// A ClusterQueue made by hand under a pool's name refuses the pool, which then gets no
// LocalQueue: it would feed a queue that is no tenant's.
func TestAPoolWhoseClusterQueueIsNoTenantsGetsNoLocalQueue(t *testing.T) {
	h := newTestHub(t)
	acme, wcs := h.tenant("acme", []string{"ml-hand"}, []string{"ml-hand"}, "eu", "us")
	names := PoolNamesOf("acme", "eu")
	hand := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: names.Queue}}
	if err := h.c.Create(t.Context(), hand); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.c.Delete(context.Background(), hand) })

	rep := h.sync(acme, wcs)
	if e := rep.Refused["eu"]; e == nil || !strings.Contains(e.Error(), "ClusterQueue "+names.Queue+" exists and is no tenant's") || len(rep.Refused) != 1 {
		t.Fatalf("refused %+v, want pool eu for its ClusterQueue", rep.Refused)
	}
	if cq, _ := h.queueOf("ml-hand", "eu"); cq != "" {
		t.Errorf("the refused pool has a LocalQueue, of ClusterQueue %s", cq)
	}
	if got := h.get("ClusterQueue", names.Queue); len(got.GetLabels()) != 0 {
		t.Errorf("the hand-made ClusterQueue was taken over: %v", got.GetLabels())
	}
	h.hasPool("acme", "us", "ml-hand", PoolNamesOf("acme", "us"))
}

// Which tenant queues in a hub namespace is the hub's configuration's word: a tenant
// whose fleet.yaml names a namespace the configuration gives another neither creates
// it nor queues there, even when it syncs first, and is told how to have it.
func TestATenantCannotTakeAHubNamespaceTheConfigurationGivesAnother(t *testing.T) {
	h := newTestHub(t)
	shared, betas, labelled := "ml-shared-"+forge.RandomHex(3), "ml-beta-"+forge.RandomHex(3), "ml-labelled-"+forge.RandomHex(3)
	h.namespace(labelled, "someone")
	acme, acmeWCs := h.tenant("acme", []string{shared, labelled}, []string{shared, labelled}, "eu")
	beta, betaWCs := h.tenant("beta", []string{shared, betas}, []string{betas}, "eu")

	rep := h.sync(beta, betaWCs)
	if !slices.Equal(rep.NotGiven, []string{shared}) || len(rep.Taken) > 0 {
		t.Errorf("beta's namespaces refused: %+v, want %s not given", rep, shared)
	}
	var ns corev1.Namespace
	if err := h.c.Get(t.Context(), client.ObjectKey{Name: shared}, &ns); !apierrors.IsNotFound(err) {
		t.Errorf("beta, which syncs first, made namespace %s (labels %v, %v)", shared, ns.Labels, err)
	}
	if log := h.logs.String(); !strings.Contains(log, "does not give the tenant") || !strings.Contains(log, "namespace="+shared) {
		t.Errorf("the hub's log does not say %s is not beta's", shared)
	}
	if cq, _ := h.queueOf(betas, "eu"); cq != PoolNamesOf("beta", "eu").Queue {
		t.Errorf("beta's own namespace %s has LocalQueue eu of %q", betas, cq)
	}

	rep = h.sync(acme, acmeWCs)
	if len(rep.NotGiven) > 0 || !maps.Equal(rep.Taken, map[string]string{labelled: "someone"}) {
		t.Errorf("acme's namespaces refused: %+v, want %s taken by someone", rep, labelled)
	}
	if err := h.c.Get(t.Context(), client.ObjectKey{Name: shared}, &ns); err != nil || ns.Labels[v1alpha1.TenantLabel] != "acme" {
		t.Errorf("namespace %s is labelled %v (%v), want acme's", shared, ns.Labels, err)
	}
	h.hasPool("acme", "eu", shared, PoolNamesOf("acme", "eu"))
	if cq, _ := h.queueOf(labelled, "eu"); cq != "" {
		t.Errorf("acme queues in %s, labelled for another tenant", labelled)
	}

	if rep = h.sync(beta, betaWCs); !slices.Equal(rep.NotGiven, []string{shared}) {
		t.Errorf("beta's namespaces refused at its next sync: %+v", rep)
	}
	if cq, owner := h.queueOf(shared, "eu"); cq != PoolNamesOf("acme", "eu").Queue || owner != "acme" {
		t.Errorf("LocalQueue %s/eu feeds %q of %q, want acme's", shared, cq, owner)
	}
}
