package podrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// fieldManager names the Runner in the managed fields of what it writes.
const fieldManager = "podrunner"

// Options say what a Runner plays.
type Options struct {
	// Deployments are the Deployments whose Pods the Runner runs. Others, such as the
	// Kueue and JobSet Deployments that test/componenttest plays, are left alone.
	Deployments []types.NamespacedName

	// Images maps an image repository (the reference without its tag or digest) to the
	// binary that plays it. A container whose image is not here does not start, as an
	// image a registry does not have: its Pod says so.
	Images map[string]string

	// Env is added to every process's environment, after the container's own.
	Env []string

	// Output receives the processes' stdout and stderr, each line prefixed with its Pod's
	// name; nil discards them. It must be safe for concurrent use.
	Output io.Writer

	// Log receives the Runner's own events (Pods started, ready, stopped; rewrites) as
	// key-value records; nil discards them.
	Log *slog.Logger
}

// Runner plays the kubelet, the deployment controller and kube-proxy for the Deployments of
// Options on one plane. Start makes one; Stop ends it.
type Runner struct {
	plane *controlplane.ControlPlane
	cs    kubernetes.Interface
	opts  Options
	log   *slog.Logger
	node  string
	queue workqueue.TypedDelayingInterface[types.NamespacedName]
	// balancers are the LoadBalancer Services whose status may need the played address.
	balancers workqueue.TypedDelayingInterface[types.NamespacedName]
	ctx       context.Context
	cancel    context.CancelFunc
	workers   sync.WaitGroup
	pods      corelisters.PodLister
	services  corelisters.ServiceLister
	probes    *http.Client

	mu         sync.Mutex
	running    map[types.NamespacedName]*pod // by the Pod's key
	forwarders map[servicePort]*forwarder
	seq        int

	stopOnce sync.Once
	stopErr  error
}

// Start watches plane for the Deployments of opts and plays them from now on. ctx bounds
// the start only; the Runner runs until Stop.
func Start(ctx context.Context, plane *controlplane.ControlPlane, opts Options) (*Runner, error) {
	if plane == nil {
		return nil, errors.New("starting the pod runner: no control plane")
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Output == nil {
		opts.Output = io.Discard
	}
	cfg := rest.CopyConfig(plane.Config)
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting the pod runner on %s: %w", plane.Name, err)
	}
	r := &Runner{
		plane:      plane,
		cs:         cs,
		opts:       opts,
		log:        log.With("plane", plane.Name),
		node:       "podrunner-" + plane.Name,
		queue:      workqueue.NewTypedDelayingQueue[types.NamespacedName](),
		balancers:  workqueue.NewTypedDelayingQueue[types.NamespacedName](),
		running:    map[types.NamespacedName]*pod{},
		forwarders: map[servicePort]*forwarder{},
		probes:     newProbeClient(),
	}
	// The Runner's own context ends with Stop, not with the caller's: it outlives Start.
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))

	factory := informers.NewSharedInformerFactory(cs, 0)
	deployments := factory.Apps().V1().Deployments().Informer()
	podInformer := factory.Core().V1().Pods()
	svcInformer := factory.Core().V1().Services()
	r.pods, r.services = podInformer.Lister(), svcInformer.Lister()
	onDeployment := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if d, ok := obj.(*appsv1.Deployment); ok {
			if key := (types.NamespacedName{Namespace: d.Namespace, Name: d.Name}); r.plays(key) {
				r.queue.Add(key)
			}
		}
	}
	// A Pod deleted through the API (kubectl delete pod, a drain) is stopped and replaced by
	// its Deployment's reconcile.
	onPod := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok {
			r.mu.Lock()
			own := r.running[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}]
			r.mu.Unlock()
			if own != nil {
				r.queue.Add(own.deployment)
			}
		}
	}
	var errs []error
	for inf, fn := range map[cache.SharedIndexInformer]func(any){deployments: onDeployment, podInformer.Informer(): onPod} {
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, obj any) { fn(obj) },
			DeleteFunc: fn,
		})
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		r.cancel()
		return nil, fmt.Errorf("starting the pod runner on %s: %w", plane.Name, err)
	}
	// A LoadBalancer Service that the Runner plays gets the loopback address as its load
	// balancer's, as a cloud's controller writes the address it provisioned.
	onService := func(obj any) {
		if svc, ok := obj.(*corev1.Service); ok && svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			r.balancers.Add(types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name})
		}
	}
	if _, err := svcInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onService,
		UpdateFunc: func(_, obj any) { onService(obj) },
	}); err != nil {
		r.cancel()
		return nil, fmt.Errorf("starting the pod runner on %s: %w", plane.Name, err)
	}
	factory.Start(r.ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), deployments.HasSynced, podInformer.Informer().HasSynced, svcInformer.Informer().HasSynced) {
		r.cancel()
		factory.Shutdown()
		return nil, fmt.Errorf("starting the pod runner on %s: informers did not sync: %w", plane.Name, ctx.Err())
	}
	// One worker per Deployment: the queue never hands one Deployment to two workers, and a
	// Pod that takes its time to stop does not hold up another Deployment.
	for range opts.Deployments {
		r.workers.Go(r.work)
	}
	r.workers.Go(r.balance)
	r.workers.Go(func() {
		<-r.ctx.Done()
		r.queue.ShutDown()
		r.balancers.ShutDown()
		factory.Shutdown()
	})
	for _, key := range opts.Deployments {
		r.queue.Add(key)
	}
	r.log.Info("pod runner started", "deployments", fmt.Sprint(opts.Deployments))
	return r, nil
}

func (r *Runner) plays(key types.NamespacedName) bool {
	return slices.Contains(r.opts.Deployments, key)
}

func (r *Runner) work() {
	for {
		key, shutdown := r.queue.Get()
		if shutdown {
			return
		}
		if err := r.reconcile(r.ctx, key); err != nil && r.ctx.Err() == nil {
			r.log.Warn("deployment not in line with its Pods; retrying", "deployment", key.String(), "err", err)
			r.queue.AddAfter(key, time.Second)
		}
		r.queue.Done(key)
	}
}

// reconcile brings the Pods of Deployment key in line with it: Pods created, rolled out,
// replaced or stopped, and the Deployment's status written.
func (r *Runner) reconcile(ctx context.Context, key types.NamespacedName) error {
	dep, err := r.cs.AppsV1().Deployments(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		for _, p := range r.podsOf(key) {
			r.terminate(ctx, p, "its deployment is gone")
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading deployment %s: %w", key, err)
	}
	hash, err := templateHash(&dep.Spec.Template)
	if err != nil {
		return err
	}
	want := int(ptr.Deref(dep.Spec.Replicas, 1))

	// Pods deleted through the API are stopped and forgotten; the rest are counted.
	var current, old []*pod
	for _, p := range r.podsOf(key) {
		obj, err := r.cs.CoreV1().Pods(p.key.Namespace).Get(ctx, p.key.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading pod %s: %w", p.key, err)
		}
		if apierrors.IsNotFound(err) || obj.DeletionTimestamp != nil {
			r.terminate(ctx, p, "its Pod was deleted")
			continue
		}
		if p.hash == hash {
			current = append(current, p)
		} else {
			old = append(old, p)
		}
	}
	// Recreate stops every old Pod before a new one starts; RollingUpdate once the new ones
	// are ready.
	if len(old) > 0 && dep.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		for _, p := range old {
			r.terminate(ctx, p, "rolled out (Recreate)")
		}
		old = nil
	}
	for len(current) < want {
		p, err := r.createPod(ctx, dep, hash)
		if err != nil {
			return errors.Join(err, r.writeStatus(ctx, dep, hash, current, old))
		}
		current = append(current, p)
	}
	for len(current) > want {
		r.terminate(ctx, current[len(current)-1], "scaled down")
		current = current[:len(current)-1]
	}
	if len(old) > 0 && readyCount(current) == want {
		for _, p := range old {
			r.terminate(ctx, p, "rolled out")
		}
		old = nil
	}
	return r.writeStatus(ctx, dep, hash, current, old)
}

// podsOf returns the Runner's Pods of Deployment key, oldest first.
func (r *Runner) podsOf(key types.NamespacedName) []*pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*pod
	for _, p := range r.running {
		if p.deployment == key {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *pod) int { return a.seq - b.seq })
	return out
}

func readyCount(pods []*pod) int {
	n := 0
	for _, p := range pods {
		if p.isReady() {
			n++
		}
	}
	return n
}

// Pod is a played Pod as a test sees it.
type Pod struct {
	// Name is the Pod object's name; Deployment the Deployment it plays a replica of.
	Name       string
	Deployment types.NamespacedName
	// Pid is the process's id, 0 while none runs; Ready whether its readiness probe passes.
	Pid   int
	Ready bool
	// Restarts counts the process's starts after its first.
	Restarts int
	// Ports maps each container port to the loopback address the process serves it on.
	Ports map[int32]string
}

// Pods returns the played Pods of Deployment key, oldest first.
func (r *Runner) Pods(key types.NamespacedName) []Pod {
	var out []Pod
	for _, p := range r.podsOf(key) {
		out = append(out, p.snapshot())
	}
	return out
}

// Stop stops every process and forwarder, deletes the Runner's Pods and returns once no
// process of the Runner runs. It may be called more than once; every call returns the
// first one's error.
func (r *Runner) Stop() error {
	if r == nil {
		return nil
	}
	r.stopOnce.Do(func() {
		r.cancel()
		r.workers.Wait()
		r.mu.Lock()
		pods := make([]*pod, 0, len(r.running))
		for _, p := range r.running {
			pods = append(pods, p)
		}
		fwds := make([]*forwarder, 0, len(r.forwarders))
		for _, f := range r.forwarders {
			fwds = append(fwds, f)
		}
		r.mu.Unlock()
		var wg sync.WaitGroup
		errs := make([]error, len(pods))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i, p := range pods {
			wg.Go(func() {
				p.stop()
				err := r.cs.CoreV1().Pods(p.key.Namespace).Delete(ctx, p.key.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				if err != nil && !apierrors.IsNotFound(err) {
					errs[i] = fmt.Errorf("deleting pod %s: %w", p.key, err)
				}
			})
		}
		wg.Wait()
		for _, f := range fwds {
			f.close()
		}
		if err := errors.Join(errs...); err != nil {
			r.stopErr = fmt.Errorf("stopping the pod runner on %s: %w", r.plane.Name, err)
			return
		}
		r.log.Info("pod runner stopped")
	})
	return r.stopErr
}
