package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// What dispatch refuses a fleet fails the fleet's summary, each refusal saying what is
// whose and how to fix it: here the pool us, whose MultiKueueConfig's name tenant "7"'s
// pool of old names (7-example-us) holds, and the workload namespace ml-training, which
// the hub's configuration does not give the tenant. The tenant's other pool, eu, gets
// its objects all the same.
func TestWhatDispatchRefusesAFleetFailsItsSummary(t *testing.T) {
	ctx := t.Context()
	c := planes[0].Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: dispatch.DefaultKueueNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	held := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: "7-example-us", Labels: map[string]string{v1alpha1.TenantLabel: "7"}}}
	if err := c.Create(ctx, held); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The hub's cluster is shared with the package's other tests.
		_ = c.Delete(context.Background(), held)
		for _, kind := range []string{"ResourceFlavor", "MultiKueueConfig", "AdmissionCheck", "ClusterQueue", "MultiKueueCluster"} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(kueue.GroupVersion.WithKind(kind))
			_ = c.DeleteAllOf(context.Background(), u, client.MatchingLabels{v1alpha1.TenantLabel: "example"})
		}
	})

	w := startWave(t, waveOptions{clusters: 2, threshold: DefaultSummaryThreshold, dispatch: true})
	// Dispatch places the clusters whose agents registered.
	for i := range 2 {
		key := client.ObjectKey{Namespace: w.ns, Name: fleetgen.ClusterName(i)}
		w.desiredRecorded(key)
		if _, err := w.status.Record(ctx, key, conditions.Redeemed{TokenHash: "sha256:" + strings.Repeat("ab", 32), At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	head := w.repo.Head("main")
	refused := "dispatch pool us: MultiKueueConfig 7-example-us is tenant 7's"
	notGiven := "workload namespace ml-training is not given to the tenant on the hub, so it has no LocalQueue there: add it to dispatch.workloadNamespaces of source fleet in the hub's configuration"
	poll.Until(t, "the fleet's summary says what dispatch refuses", func() (bool, string) {
		w.src.wakeDispatch()
		_, body := w.page(head, ".json")
		var page CommitPage
		if err := json.Unmarshal([]byte(body), &page); err != nil || page.Fleet == nil {
			return false, fmt.Sprintf("no summary on the page yet: %s", body)
		}
		return page.Fleet.State == commitstatus.Failure && strings.Contains(page.Fleet.Description, refused) && strings.Contains(page.Fleet.Description, notGiven),
			fmt.Sprintf("%s %q", page.Fleet.State, page.Fleet.Description)
	})
	// What the forge shows: the refused pool comes first, within GitHub's 140 characters.
	w.settled(head, func(st commitstatus.Status) bool {
		return st.State == commitstatus.Failure && strings.Contains(st.Description, refused)
	})

	for pool, hold := range map[string]bool{"eu": false, "us": true} {
		var cq kueue.ClusterQueue
		name := dispatch.PoolNamesOf("example", pool).Queue
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &cq); err != nil {
			t.Errorf("pool %s: %v", pool, err)
			continue
		}
		if holds := cq.Spec.StopPolicy != nil && *cq.Spec.StopPolicy == kueue.Hold; holds != hold {
			t.Errorf("pool %s's ClusterQueue %s holds: %t, want %t", pool, name, holds, hold)
		}
	}
	var mkc kueue.MultiKueueConfig
	if err := c.Get(ctx, client.ObjectKey{Name: "7-example-us"}, &mkc); !apierrors.IsNotFound(err) {
		t.Errorf("the refused pool took the name tenant 7's pool holds: %v", err)
	}
}
