package dispatch

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

// PoolNames name the cluster-scoped hub objects of one dispatch pool.
type PoolNames struct {
	// Queue names the pool's ClusterQueue, ResourceFlavor and AdmissionCheck: the
	// names an admitted workload records, which therefore never change under it.
	Queue string
	// Config names the pool's MultiKueueConfig, which only the AdmissionCheck names.
	Config string
}

// PoolNamesOf are the names of the tenant's pool on a hub where the pool has none yet.
//
// Queue is <tenant>.<pool>. Tenants and pools are DNS labels, which hold no dot, so the
// first dot splits the name back into the two: no other tenant's pool can bear it, and
// neither can any pool named before (<tenant>-<pool>, which holds no dot either). At
// most 63+1+40 characters, within the 253 Kueue allows these names and references.
//
// Config is <len(tenant)>-<tenant>-<pool>, shortened with a hash past 63 characters as
// a worker's identity is (fleet.Identity): Kueue refers to the MultiKueueConfig from
// the AdmissionCheck's parameters by a DNS label, which allows no dot. The length
// prefix keeps it unambiguous among the pools named so; it can equal the old name of
// a pool of a tenant named by digits alone ("4" and pool "acme-eu" against "acme" and
// pool "eu"), which the check of a pool's names refuses (viewPool). Two tenants' long
// names that hash alike (40 bits, as two identities may) are the one clash left to
// whichever pool takes the name first.
func PoolNamesOf(tenant, pool string) PoolNames {
	return PoolNames{Queue: tenant + "." + pool, Config: fleet.Identity(tenant, pool)}
}

// oldPoolNames are the names hubs before this one gave every object of a pool:
// <tenant>-<pool>, which tenant "acme" with pool "us-eu" shares with tenant "acme-us"
// with pool "eu". A pool whose ClusterQueue the tenant holds under it keeps it: the
// work admitted there records these names.
func oldPoolNames(tenant, pool string) PoolNames {
	n := tenant + "-" + pool
	return PoolNames{Queue: n, Config: n}
}

// HubView is what a Sync read of the hub cluster for Build: which of the tenant's
// workload namespaces it queues in, and what each of its pools is named and whether
// its names are free.
type HubView struct {
	// Namespaces are the workload namespaces the tenant queues in on the hub.
	Namespaces map[string]bool
	// Pools are the pools by name; a pool not listed is named by PoolNamesOf and
	// finds its names free.
	Pools map[string]PoolView
}

// pool is the view of the tenant's pool.
func (v HubView) pool(tenant, pool string) PoolView {
	if p, ok := v.Pools[pool]; ok {
		return p
	}
	return PoolView{Names: PoolNamesOf(tenant, pool)}
}

// PoolView is one pool as the hub holds it.
type PoolView struct {
	Names PoolNames
	// Held are the objects of the pool whose names something other than the tenant
	// holds on the hub. A pool with any is refused: those are not written, and its
	// ClusterQueue holds (no new job is admitted; admitted ones run on), since it may
	// name another tenant's AdmissionCheck or reach another tenant's workers.
	Held []Held
}

// Held is an object of a pool whose name is not the tenant's on the hub.
type Held struct {
	// Kind and Name are the pool's object that is not written.
	Kind, Name string
	// Owner is the tenant the holder is labelled for; empty when it is no tenant's.
	Owner string
	// By names the holder when it is not an object of that kind and name: the
	// ClusterQueue of another tenant's pool named before names were unambiguous, whose
	// MultiKueueConfig bears the same name.
	By string
}

// String says whose the name is.
func (h Held) String() string {
	switch {
	case h.By != "":
		return fmt.Sprintf("%s %s is tenant %s's (the name of its pool of ClusterQueue %s, named before names were unambiguous)", h.Kind, h.Name, h.Owner, h.By)
	case h.Owner != "":
		return fmt.Sprintf("%s %s is tenant %s's", h.Kind, h.Name, h.Owner)
	}
	return fmt.Sprintf("%s %s exists and is no tenant's (no %s label)", h.Kind, h.Name, v1alpha1.TenantLabel)
}

// PoolRefusedError is a pool whose names are not all the tenant's on the hub.
type PoolRefusedError struct {
	Pool string
	Held []Held
}

func (e *PoolRefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dispatch pool %s: ", e.Pool)
	for i, h := range e.Held {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(h.String())
	}
	b.WriteString(": the pool admits no new job until the name is free (delete what holds it if nothing runs there) or the pool is renamed in fleet.yaml")
	return b.String()
}

// viewPool names the tenant's pool and finds what holds its names. It reads metadata
// alone, by name: what the hub holds now, whichever tenant synced first, so the same
// hub refuses the same pool in whatever order its tenants sync.
func (d *Dispatcher) viewPool(ctx context.Context, tenant, pool string) (PoolView, error) {
	view := PoolView{Names: PoolNamesOf(tenant, pool)}
	old := oldPoolNames(tenant, pool)
	owner, found, err := d.ownerOf(ctx, "ClusterQueue", old.Queue)
	if err != nil {
		return view, err
	}
	if found && owner == tenant {
		view.Names = old
	}
	for _, o := range []struct{ kind, name string }{
		{"ResourceFlavor", view.Names.Queue}, {"MultiKueueConfig", view.Names.Config},
		{"AdmissionCheck", view.Names.Queue}, {"ClusterQueue", view.Names.Queue},
	} {
		owner, found, err := d.ownerOf(ctx, o.kind, o.name)
		if err != nil {
			return view, err
		}
		if found && owner != tenant {
			view.Held = append(view.Held, Held{Kind: o.kind, Name: o.name, Owner: owner})
		}
	}
	if view.Names.Config != view.Names.Queue && !heldAs(view.Held, "MultiKueueConfig") {
		// A pool named before takes all four names at once: its ClusterQueue claims its
		// MultiKueueConfig's name even while that object is missing.
		owner, found, err := d.ownerOf(ctx, "ClusterQueue", view.Names.Config)
		if err != nil {
			return view, err
		}
		if found && owner != tenant && owner != "" && strings.HasPrefix(view.Names.Config, owner+"-") {
			view.Held = append(view.Held, Held{Kind: "MultiKueueConfig", Name: view.Names.Config, Owner: owner, By: view.Names.Config})
		}
	}
	return view, nil
}

func heldAs(held []Held, kind string) bool {
	for _, h := range held {
		if h.Kind == kind {
			return true
		}
	}
	return false
}

// ownerOf reads whose the cluster-scoped Kueue object kind/name is: the tenant it is
// labelled for, empty for none; found is false when it does not exist.
func (d *Dispatcher) ownerOf(ctx context.Context, kind, name string) (owner string, found bool, err error) {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(kueue.GroupVersion.WithKind(kind))
	switch err := d.opts.Client.Get(ctx, client.ObjectKey{Name: name}, obj); {
	case apierrors.IsNotFound(err):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("reading %s %s: %w", kind, name, err)
	}
	return obj.GetLabels()[v1alpha1.TenantLabel], true, nil
}
