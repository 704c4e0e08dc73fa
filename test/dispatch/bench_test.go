package dispatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/proxy"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// benchJobs is how many jobs BenchmarkDispatch/SubmitToWorker submits per iteration.
const benchJobs = 50

// benchWorkloads is how many Workloads the LIST of BenchmarkDispatch/ProxyOverhead
// reads.
const benchWorkloads = 1000

// Each iteration of the ProxyOverhead benchmarks takes this many samples of each side
// (300 GETs, 20 LISTs, 100 watch events), so that make bench's single iteration
// still measures a mean.
const watchSamples = 100

// watchedLabel marks the one Workload the watch-event benchmark changes and watches,
// as MultiKueue watches by a label.
const watchedLabel = "flotilla.dev/bench-watched"

// BenchmarkDispatch starts one world for its sub-benchmarks:
//
//   - SubmitToWorker: submit-on-hub to Job-created-on-worker latency, p50 and p95 over
//     50 jobs submitted one after another through the tunnel, and as many, in turn with
//     them, through a MultiKueueCluster that reaches the same worker's API server
//     straight: Kueue's own floor. Kueue v0.17.0 holds every event of a worker's
//     Workload for a second (constants.UpdatesBatchPeriod) before the hub's MultiKueue
//     acts on it, and the Job is created on the worker only after that. Quota reserved
//     on the hub is marked too: Kueue's scheduling on the hub, no worker involved;
//   - ProxyOverhead: a GET of a Workload, a LIST of 1,000 Workloads and the latency of a
//     watch event, through the hub's API proxy and the tunnel against the worker's API
//     server directly (as the same flotilla-dispatch identity), side by side in one run,
//     with the ratio.
//
// Run it with
//
//	go test -run '^$' -bench Dispatch -benchtime 1x ./test/dispatch/
func BenchmarkDispatch(b *testing.B) {
	w := newWorld(b, worldOptions{tenant: "bench", workloads: "ml-bench"})
	w.allDispatchable(b)
	b.Run("SubmitToWorker", w.benchSubmitToWorker)
	b.Run("ProxyOverhead", w.benchProxyOverhead)
}

func (w *world) benchSubmitToWorker(b *testing.B) {
	ctx := b.Context()
	eu := w.worker("gpu-eu")
	directPlane, direct := w.directQueue(b)
	seen := newFirstSeen()
	// The workers' jobs are noticed by a watch, not by polling, so that the figures are
	// the system's and not the poll interval's.
	for _, plane := range []*controlplane.ControlPlane{eu.plane, directPlane} {
		wc, err := client.NewWithWatch(plane.Config, client.Options{Scheme: plane.Client.Scheme()})
		if err != nil {
			b.Fatal(err)
		}
		jobs, err := wc.Watch(ctx, &batchv1.JobList{}, client.InNamespace(w.workloads))
		if err != nil {
			b.Fatal(err)
		}
		defer jobs.Stop()
		go func() {
			for ev := range jobs.ResultChan() {
				if j, ok := ev.Object.(*batchv1.Job); ok && ev.Type == watch.Added {
					seen.mark("worker", j.Name)
				}
			}
		}()
	}
	hc, err := client.NewWithWatch(w.hub.Config, client.Options{Scheme: w.hub.Client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	wls, err := hc.Watch(ctx, &kueue.WorkloadList{}, client.InNamespace(w.workloads))
	if err != nil {
		b.Fatal(err)
	}
	defer wls.Stop()
	go func() {
		for ev := range wls.ResultChan() {
			wl, ok := ev.Object.(*kueue.Workload)
			if !ok {
				continue
			}
			for _, o := range wl.OwnerReferences {
				if o.Kind != "Job" {
					continue
				}
				if apimeta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved) {
					seen.mark("reserved", o.Name)
				}
			}
		}
	}()

	// One job through the tunnel, then one straight to a worker's API server, in turn,
	// so that both sides see the same machine at the same time.
	sides := []struct{ name, queue string }{{"proxy", "eu"}, {"direct", direct}}
	total := make([][]time.Duration, len(sides))
	var reservedAt []time.Duration
	b.ResetTimer()
	for i := range b.N {
		for n := range benchJobs {
			for s, side := range sides {
				j := w.newJob(fmt.Sprintf("bench-%s-%d-%d", side.name, i, n), side.queue)
				// Small requests: all of them fit the pool's quota at once, so that none
				// waits for another to finish.
				j.Spec.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("1Mi")}
				submitted := time.Now()
				if err := w.hub.Client.Create(ctx, j); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { w.deleteJob(j.Name) })
				var created, reserved time.Time
				poll.Until(b, "job "+j.Name+" reserved on the hub and created on the worker", func() (bool, string) {
					var ok [2]bool
					created, ok[0] = seen.get("worker", j.Name)
					reserved, ok[1] = seen.get("reserved", j.Name)
					return ok == [2]bool{true, true}, fmt.Sprintf("created on the worker, quota reserved on the hub: %v", ok)
				})
				total[s] = append(total[s], created.Sub(submitted))
				if side.name == "proxy" {
					reservedAt = append(reservedAt, reserved.Sub(submitted))
				}
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(0, "ns/op")
	report(b, "submit-to-worker", total[0])
	report(b, "direct-submit-to-worker", total[1])
	report(b, "submit-to-reserved", reservedAt)
	b.ReportMetric(float64(median(total[0]))/float64(median(total[1])), "p50-proxy/direct")
}

// directQueue sets up, beside the pool flotilla made, a hub queue whose MultiKueue
// reaches a worker's API server straight, with the plane's own kubeconfig: Kueue with
// no flotilla between the hub and the worker, whose submit-to-worker latency is the
// floor of the proxied one. The worker is a plane of its own, with its own Kueue and
// the same worker configuration: two MultiKueueClusters of one hub watching one worker
// would each see the other's Workloads. It returns the hub LocalQueue to submit to.
func (w *world) directQueue(b *testing.B) (*controlplane.ControlPlane, string) {
	ctx := b.Context()
	name := w.tenant + "-direct"
	started, err := controlplane.Start(ctx, 1, controlplane.Options{})
	if err != nil {
		b.Fatalf("starting the direct worker's control plane: %v", err)
	}
	plane := started[0]
	b.Cleanup(func() { _ = plane.Stop() })
	m, err := kueuetest.Start(ctx, plane, kueuetest.Options{Config: dispatch.WorkerKueueConfiguration()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Stop() })

	ref := &kueue.AdmissionCheckParametersReference{APIGroup: kueue.GroupVersion.Group, Kind: "MultiKueueConfig", Name: name}
	queue := func(checks ...string) []client.Object {
		quota := kueue.FlavorQuotas{Name: kueue.ResourceFlavorReference(name), Resources: []kueue.ResourceQuota{
			{Name: corev1.ResourceCPU, NominalQuota: resource.MustParse("100")}, {Name: corev1.ResourceMemory, NominalQuota: resource.MustParse("100Gi")}}}
		cq := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kueue.ClusterQueueSpec{
			NamespaceSelector: &metav1.LabelSelector{},
			ResourceGroups:    []kueue.ResourceGroup{{CoveredResources: []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}, Flavors: []kueue.FlavorQuotas{quota}}}}}
		for _, c := range checks {
			cq.Spec.AdmissionChecksStrategy = &kueue.AdmissionChecksStrategy{AdmissionChecks: []kueue.AdmissionCheckStrategyRule{{Name: kueue.AdmissionCheckReference(c)}}}
		}
		return []client.Object{
			&kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: name}},
			cq,
			// MultiKueue creates the worker's copy under the hub LocalQueue's name.
			&kueue.LocalQueue{ObjectMeta: metav1.ObjectMeta{Namespace: w.workloads, Name: name}, Spec: kueue.LocalQueueSpec{ClusterQueue: kueue.ClusterQueueReference(name)}},
		}
	}
	workerObjects := append([]client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.workloads}}}, queue()...)
	hubObjects := append([]client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kueuetest.Namespace, Name: name}, Data: map[string][]byte{dispatch.KubeConfigKey: plane.KubeConfig}},
		&kueue.MultiKueueCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kueue.MultiKueueClusterSpec{ClusterSource: kueue.ClusterSource{
			KubeConfig: &kueue.KubeConfig{LocationType: kueue.SecretLocationType, Location: name}}}},
		&kueue.MultiKueueConfig{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kueue.MultiKueueConfigSpec{Clusters: []string{name}}},
		&kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kueue.AdmissionCheckSpec{ControllerName: dispatch.MultiKueueController, Parameters: ref}},
	}, queue(name)...)
	b.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = w.hub.Client.DeleteAllOf(cctx, &batchv1.Job{}, client.InNamespace(w.workloads), client.MatchingLabels{queueLabel: name},
			client.PropagationPolicy(metav1.DeletePropagationBackground))
		for _, o := range slices.Backward(hubObjects) {
			_ = w.hub.Client.Delete(cctx, o)
		}
	})
	for _, o := range workerObjects {
		if err := plane.Client.Create(ctx, o); err != nil {
			b.Fatalf("creating %T %s on the direct worker: %v", o, o.GetName(), err)
		}
	}
	for _, o := range hubObjects {
		if err := w.hub.Client.Create(ctx, o); err != nil {
			b.Fatalf("creating %T %s on the hub: %v", o, o.GetName(), err)
		}
	}
	poll.Until(b, "the direct MultiKueueCluster "+name+" active", func() (bool, string) {
		var mc kueue.MultiKueueCluster
		if err := w.hub.Client.Get(ctx, client.ObjectKey{Name: name}, &mc); err != nil {
			return false, err.Error()
		}
		return apimeta.IsStatusConditionTrue(mc.Status.Conditions, kueue.MultiKueueClusterActive), fmt.Sprint(mc.Status.Conditions)
	})
	return plane, name
}

// median of ds, which report has sorted.
func median(ds []time.Duration) time.Duration { return ds[(len(ds)-1)/2] }

// report reports the p50 and p95 of ds in milliseconds.
func report(b *testing.B, name string, ds []time.Duration) {
	slices.Sort(ds)
	p := func(q float64) float64 { return float64(ds[int(q*float64(len(ds)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(p(0.50), name+"-p50-ms")
	b.ReportMetric(p(0.95), name+"-p95-ms")
}

// firstSeen records when something was first noticed, by kind and name.
type firstSeen struct {
	mu sync.Mutex
	at map[string]time.Time
}

func newFirstSeen() *firstSeen { return &firstSeen{at: map[string]time.Time{}} }

func (f *firstSeen) mark(kind, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.at[kind+"/"+name]; !ok {
		f.at[kind+"/"+name] = time.Now()
	}
}

func (f *firstSeen) get(kind, name string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.at[kind+"/"+name]
	return t, ok
}

func (w *world) benchProxyOverhead(b *testing.B) {
	ctx := b.Context()
	eu := w.worker("gpu-eu")
	// As MultiKueue reads a worker: in a workload namespace of the fleet, objects that
	// carry the hub's origin. Each has its namesake on the hub, or the hub Kueue's
	// garbage collector would delete it from the worker as an orphan.
	ns := w.workloads
	admin := eu.plane.Client
	b.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, c := range []client.Client{admin, w.hub.Client} {
			_ = c.DeleteAllOf(cctx, &kueue.Workload{}, client.InNamespace(ns), client.MatchingLabels{v1alpha1.ManagedByLabel: "bench"})
		}
	})
	var g errgroup.Group
	g.SetLimit(8)
	for i := range benchWorkloads {
		g.Go(func() error {
			wl := benchWorkload(ns, fmt.Sprintf("wl-%04d", i))
			if err := w.hub.Client.Create(ctx, wl.DeepCopy()); err != nil {
				return err
			}
			wl.Labels[kueue.MultiKueueOriginLabel] = dispatch.Origin
			if i == 0 {
				wl.Labels[watchedLabel] = "true"
			}
			return admin.Create(ctx, wl)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}

	// Both sides as the same identity, flotilla-dispatch, so that the API server's own
	// work is the same and the difference is the hub's proxy and the tunnel.
	direct := rest.CopyConfig(eu.agentConfig)
	direct.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + agentNamespace + ":" + proxy.DefaultServiceAccount}
	through := w.kueueConfig(b, eu)
	// Straight to the leader's proxy: the test's Service in front of it copies every
	// byte in user space, which no kube-proxy does.
	through.Host = strings.Replace(through.Host, w.proxySvc.Addr(), w.replicas[0].proxyL.Addr().String(), 1)
	sides := []struct {
		name string
		cfg  *rest.Config
	}{{"direct", direct}, {"proxy", through}}

	get := "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + ns + "/workloads/wl-0000"
	list := "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + ns + "/workloads?labelSelector=" + url.QueryEscape(kueue.MultiKueueOriginLabel+"="+dispatch.Origin)
	for _, op := range []struct {
		name    string
		path    string
		samples int
	}{{"GET", get, 300}, {"LIST-1000-Workloads", list, 20}} {
		b.Run(op.name, func(b *testing.B) {
			var spent [2]time.Duration
			clients := make([]*http.Client, len(sides))
			for i, s := range sides {
				hc, err := rest.HTTPClientFor(s.cfg)
				if err != nil {
					b.Fatal(err)
				}
				clients[i] = hc
				fetch(b, hc, host(s.cfg)+op.path) // warm the connection
			}
			b.ResetTimer()
			for range b.N * op.samples {
				for i, s := range sides {
					began := time.Now()
					fetch(b, clients[i], host(s.cfg)+op.path)
					spent[i] += time.Since(began)
				}
			}
			b.StopTimer()
			reportSides(b, spent, b.N*op.samples)
		})
	}

	b.Run("watch-event", func(b *testing.B) {
		var watches []watch.Interface
		for _, s := range sides {
			c, err := client.NewWithWatch(s.cfg, client.Options{Scheme: admin.Scheme()})
			if err != nil {
				b.Fatal(err)
			}
			wt, err := c.Watch(ctx, &kueue.WorkloadList{}, client.InNamespace(ns), client.MatchingLabels{watchedLabel: "true", kueue.MultiKueueOriginLabel: dispatch.Origin})
			if err != nil {
				b.Fatalf("watching through %s: %v", s.name, err)
			}
			defer wt.Stop()
			watches = append(watches, wt)
		}
		var spent [2]time.Duration
		wl := &kueue.Workload{}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "wl-0000"}, wl); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := range b.N * watchSamples {
			patch := client.MergeFrom(wl.DeepCopy())
			// A value no earlier run of this benchmark wrote, or the patch changes nothing.
			wl.Annotations = map[string]string{"bench": fmt.Sprint(time.Now().UnixNano(), i)}
			began := time.Now()
			if err := admin.Patch(ctx, wl, patch); err != nil {
				b.Fatal(err)
			}
			for s, wt := range watches {
				spent[s] += nextModified(b, sides[s].name, wt, wl.ResourceVersion).Sub(began)
			}
		}
		b.StopTimer()
		reportSides(b, spent, b.N*watchSamples)
	})
}

// nextModified waits for the watch event of resourceVersion rv and returns when it came.
func nextModified(b *testing.B, side string, wt watch.Interface, rv string) time.Time {
	timeout := time.NewTimer(poll.Deadline)
	defer timeout.Stop()
	for {
		select {
		case ev, ok := <-wt.ResultChan():
			if !ok {
				b.Fatalf("the watch %s ended", side)
			}
			if o, ok := ev.Object.(client.Object); ok && ev.Type == watch.Modified && o.GetResourceVersion() == rv {
				return time.Now()
			}
		case <-timeout.C:
			b.Fatalf("no event of resourceVersion %s %s within %s", rv, side, poll.Deadline)
		}
	}
}

// host is the server URL of cfg without a trailing slash, to put an API path after.
func host(cfg *rest.Config) string { return strings.TrimSuffix(cfg.Host, "/") }

func fetch(b *testing.B, hc *http.Client, url string) {
	req, err := http.NewRequestWithContext(b.Context(), http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %s", url, resp.Status)
	}
	_ = n
}

// reportSides reports each side's mean in milliseconds and the proxy's ratio to direct.
func reportSides(b *testing.B, spent [2]time.Duration, n int) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(n) / float64(time.Millisecond) }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(spent[0]), "direct-ms/op")
	b.ReportMetric(ms(spent[1]), "proxy-ms/op")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "proxy/direct")
}

// benchWorkload is a Workload no queue admits: it is only read.
func benchWorkload(ns, name string) *kueue.Workload {
	return &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.ManagedByLabel: "bench"}},
		Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{
			Name:  kueue.DefaultPodSetName,
			Count: 1,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
			}},
		}}},
	}
}
