package leader_test

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/reconciler/leader"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, 1, &planes, controlplane.Options{WithoutComponentCRDs: true})
}

// replica is one hub replica: its Pod (no kubelet runs it; the label is what counts) and
// its Elector, whose lead serves until the Lease is lost or the replica stops.
type replica struct {
	pod    string
	log    *logtest.Buffer
	stop   context.CancelFunc
	leads  chan struct{}
	result chan error
}

func newNamespace(t *testing.T, name string, pods ...string) {
	t.Helper()
	ctx := t.Context()
	c := planes[0].Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p, Namespace: name, Labels: map[string]string{"app.kubernetes.io/name": "flotilla-hub"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "hub", Image: "flotilla-hub"}}}}
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
}

// start runs a replica whose Lease is short, so that a test sees a takeover in seconds.
func start(t *testing.T, namespace, pod string) *replica {
	t.Helper()
	r := &replica{pod: pod, log: &logtest.Buffer{}, leads: make(chan struct{}, 1), result: make(chan error, 1)}
	e, err := leader.New(leader.Options{Config: planes[0].Config, Namespace: namespace, Name: "flotilla-hub", Pod: pod,
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond, Log: r.log.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() {
		r.result <- e.Run(ctx, func(ctx context.Context) error {
			if err := e.Serving(ctx); err != nil {
				return err
			}
			r.leads <- struct{}{}
			<-ctx.Done()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-r.result
	})
	return r
}

// labelled names the Pods of the namespace that carry the leader label.
func labelled(t *testing.T, namespace string) string {
	t.Helper()
	var pods corev1.PodList
	if err := planes[0].Client.List(t.Context(), &pods, client.InNamespace(namespace), client.MatchingLabels{leader.Label: "true"}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	return strings.Join(names, ",")
}

func holder(t *testing.T, namespace string) string {
	t.Helper()
	var l coordinationv1.Lease
	if err := planes[0].Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "flotilla-hub"}, &l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

func TestASecondReplicaTakesOverWhenTheLeaderStopsAndTheLeaderLabelFollows(t *testing.T) {
	const ns = "takeover"
	newNamespace(t, ns, "hub-a", "hub-b")
	a := start(t, ns, "hub-a")
	<-a.leads
	if got := labelled(t, ns); got != "hub-a" {
		t.Fatalf("Pods labelled leader: %q, want hub-a", got)
	}

	b := start(t, ns, "hub-b")
	poll.Until(t, "the second replica to see the first lead", func() (bool, string) {
		return strings.Contains(b.log.String(), "another replica leads; waiting"), b.log.Last(400)
	})
	select {
	case <-b.leads:
		t.Fatal("the second replica leads beside the first")
	default:
	}
	if got := labelled(t, ns); got != "hub-a" {
		t.Fatalf("Pods labelled leader while hub-a leads: %q, want hub-a only", got)
	}

	// A rolling update: the old replica is asked to stop, releases the Lease, and the
	// other takes over within its retry period rather than the Lease's duration.
	a.stop()
	if err := <-a.result; err != nil {
		t.Fatalf("the stopped leader returned %v", err)
	}
	a.result <- nil // for the cleanup
	if got := labelled(t, ns); got != "" {
		t.Fatalf("after the leader stopped, Pods labelled leader: %q, want none until the next leads", got)
	}
	select {
	case <-b.leads:
	case <-time.After(time.Minute):
		t.Fatalf("the second replica did not take over:\n%s", b.log.Last(800))
	}
	if got, h := labelled(t, ns), holder(t, ns); got != "hub-b" || h != "hub-b" {
		t.Fatalf("after the takeover the label is on %q and the Lease held by %q, want hub-b for both", got, h)
	}
}

func TestANewLeaderTakesTheLabelOffADeadLeadersPod(t *testing.T) {
	const ns = "dead-leader"
	newNamespace(t, ns, "hub-dead", "hub-next")
	ctx := t.Context()
	c := planes[0].Client
	// The dead replica's Lease ran out long ago and its Pod still carries the label, as
	// after a node failure.
	long := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	if err := c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "flotilla-hub"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("hub-dead"), LeaseDurationSeconds: ptr.To[int32](1), AcquireTime: &long, RenewTime: &long}}); err != nil {
		t.Fatal(err)
	}
	markDead(t, ns)

	next := start(t, ns, "hub-next")
	select {
	case <-next.leads:
	case <-time.After(time.Minute):
		t.Fatalf("the replica did not take the expired Lease:\n%s", next.log.Last(800))
	}
	if got := labelled(t, ns); got != "hub-next" {
		t.Fatalf("Pods labelled leader: %q, want hub-next only", got)
	}
}

func TestAReplicaRestartedInTheLeadersPodDropsTheLabelWhileItFollows(t *testing.T) {
	const ns = "restarted"
	newNamespace(t, ns, "hub-lead", "hub-dead")
	lead := start(t, ns, "hub-lead")
	<-lead.leads
	// The container of hub-dead led before it crashed; it comes back as a follower.
	markDead(t, ns)
	restarted := start(t, ns, "hub-dead")
	poll.Until(t, "the restarted replica to follow without the label", func() (bool, string) {
		got := labelled(t, ns)
		return got == "hub-lead" && strings.Contains(restarted.log.String(), "another replica leads"), "labelled: " + got
	})
}

func markDead(t *testing.T, ns string) {
	t.Helper()
	var pod corev1.Pod
	if err := planes[0].Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "hub-dead"}, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Labels[leader.Label] = "true"
	if err := planes[0].Client.Update(t.Context(), &pod); err != nil {
		t.Fatal(err)
	}
}

func TestAnElectorNeedsItsLease(t *testing.T) {
	_, err := leader.New(leader.Options{Config: planes[0].Config})
	if err == nil || !strings.Contains(err.Error(), "namespace and name") {
		t.Fatalf("New without a Lease = %v, want an error naming what is missing", err)
	}
}
