package tunnel_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/test/heldpatch"
)

// A report the hub cluster refused once is recorded again, though the agent sends
// nothing more: a connection recorded only at hello would otherwise leave the cluster
// waiting for its agent, connected all along, until the agent reconnects.
func TestAReportTheHubClusterRefusedIsRecordedAgain(t *testing.T) {
	c := newCluster(t, "refused-once")
	plain, err := client.NewWithWatch(planes[0].Config, client.Options{Scheme: admin().Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Bool
	flaky := heldpatch.Refuse(plain, func(obj client.Object) error {
		wc, ok := obj.(*v1alpha1.WorkerCluster)
		if ok && wc.Name == c.name && condition(wc, v1alpha1.ConditionConnected) != nil && refused.CompareAndSwap(false, true) {
			return apierrors.NewServiceUnavailable("the hub cluster is restarting")
		}
		return nil
	})
	h := startHub(t, nil, func(o *tunnel.Options) { o.Client = flaky })
	h.enroll(t, c)
	eventually(t, "the hello's record refused", func() (bool, string) { return refused.Load(), "not yet" })
	eventually(t, "the connection recorded", func() (bool, string) {
		cond := condition(c.wc(t), v1alpha1.ConditionConnected)
		return cond != nil && cond.Status == metav1.ConditionTrue, fmt.Sprintf("Connected %+v", cond)
	})
}
