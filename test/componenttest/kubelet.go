package componenttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiextensionshelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

const (
	// defaultStartTimeout bounds one manager's start when Options.StartTimeout is zero:
	// generous, because managers and control planes start together on a small machine.
	defaultStartTimeout = 2 * time.Minute
	// The back-off between failed starts of a manager, as the kubelet's crash-loop back-off
	// but shorter: a test waits for it.
	backoffBase, backoffMax = time.Second, 30 * time.Second
)

// Options tunes Start. The zero value plays the charts' Deployments as the agent installs them.
type Options struct {
	// Deployments are the controller Deployments to play, by component; nil is
	// DefaultDeployments(). A component left out is not played.
	Deployments map[Component]types.NamespacedName

	// Output receives the managers' stdout and stderr; nil discards them (errors still carry
	// the last few KiB). It must be safe for concurrent use, as an *os.File is.
	Output io.Writer

	// Log receives the Kubelet's own events (rollouts, restarts, re-pointed webhooks) as
	// key-value records; nil discards them.
	Log *slog.Logger

	// StartTimeout bounds one manager's start, from running the binary to ready; zero means
	// two minutes.
	StartTimeout time.Duration

	// Pull is asked for the image of every pod template before its manager starts, as a
	// registry would be; an error keeps the manager from starting (the Deployment stays
	// unavailable, with the error as its Progressing message) and is retried with back-off.
	// Nil pulls every image.
	Pull func(ctx context.Context, c Component, image string) error
}

// Process is a component's manager as the Kubelet runs it.
type Process struct {
	Component  Component
	Deployment types.NamespacedName

	// Pid is the manager's process id.
	Pid int
	// PodTemplateHash is the hash of the pod template the manager runs (see Running);
	// Generation the Deployment's generation it was last reconciled at.
	PodTemplateHash string
	Generation      int64
	// Image is the image the pod template asks for; the process is the manager built from
	// the Go module whatever it says.
	Image string
	// Args are the container's arguments as the pod template gives them; Config the file its
	// --config names, as the chart rendered it into its ConfigMap (before the harness's
	// overrides), and ServiceAccount the identity the manager runs as.
	Args           []string
	Config         []byte
	ServiceAccount string
	// WebhookAddr is the host:port the component's webhooks are pointed at.
	WebhookAddr string
	// Started is when the manager became ready.
	Started time.Time
	// Restarts counts the starts of this pod template's manager after its first: after it
	// exited on its own, or failed to start, as a container's restartCount does.
	Restarts int
	// Rollouts counts the pod templates whose manager became ready since the Deployment
	// appeared: 1 after the install, one more for each upgrade that changed the template.
	Rollouts int
}

// Kubelet plays the kubelet and the deployment controller for the components' Deployments on
// one plane. Start makes one; Stop ends it.
type Kubelet struct {
	plane   *controlplane.ControlPlane
	cs      kubernetes.Interface
	opts    Options
	log     *slog.Logger
	queue   workqueue.TypedDelayingInterface[Component]
	ctx     context.Context
	cancel  context.CancelFunc
	workers sync.WaitGroup

	mu   sync.Mutex
	pods map[Component]*pod

	stopOnce sync.Once
	stopErr  error
}

// pod is the Kubelet's state of one component. Only the component's reconcile changes it, under
// Kubelet.mu; readers take the lock.
type pod struct {
	current *instance // the manager that runs, nil before the first start or after a stop
	// hash is the pod template that the latest start attempts were for; attempted says
	// whether there was one, rolledOut whether one became ready.
	hash                 string
	attempted, rolledOut bool
	restarts, rollouts   int
	lastErr              error
	// failures counts the failures since the manager last ran ready; retryAt is when the
	// next start may be.
	failures int
	retryAt  time.Time
	// earlier are the webhook servers of the component's earlier managers, whose URLs are
	// re-pointed too.
	earlier map[string]bool
}

// Start watches plane for the components' Deployments and webhook configurations and plays
// them from now on. ctx bounds the start only (the informers' first sync); the Kubelet runs
// until Stop.
func Start(ctx context.Context, plane *controlplane.ControlPlane, opts Options) (*Kubelet, error) {
	if plane == nil {
		return nil, errors.New("starting the components' kubelet: no control plane")
	}
	if opts.Deployments == nil {
		opts.Deployments = DefaultDeployments()
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = defaultStartTimeout
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// A kubelet and a deployment controller make many small requests: client-go's default
	// of 5 a second would starve the waits of a test.
	cfg := rest.CopyConfig(plane.Config)
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting the components' kubelet on %s: %w", plane.Name, err)
	}
	k := &Kubelet{
		plane: plane,
		cs:    cs,
		opts:  opts,
		log:   log.With("plane", plane.Name),
		queue: workqueue.NewTypedDelayingQueue[Component](),
		pods:  map[Component]*pod{},
	}
	// The Kubelet's own context ends with Stop, not with the caller's: it outlives Start.
	k.ctx, k.cancel = context.WithCancel(context.WithoutCancel(ctx))

	factory := informers.NewSharedInformerFactory(cs, 0)
	deployments := factory.Apps().V1().Deployments().Informer()
	mutating := factory.Admissionregistration().V1().MutatingWebhookConfigurations().Informer()
	validating := factory.Admissionregistration().V1().ValidatingWebhookConfigurations().Informer()
	onDeployment := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		d, ok := obj.(*appsv1.Deployment)
		if !ok {
			return
		}
		for c, key := range k.opts.Deployments {
			if key.Namespace == d.Namespace && key.Name == d.Name {
				k.queue.Add(c)
			}
		}
	}
	// A webhook configuration may be any component's: Helm writes them back on every upgrade.
	onWebhooks := func(any) {
		for c := range k.opts.Deployments {
			k.queue.Add(c)
		}
	}
	var errs []error
	for inf, fn := range map[cache.SharedIndexInformer]func(any){deployments: onDeployment, mutating: onWebhooks, validating: onWebhooks} {
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, obj any) { fn(obj) },
			DeleteFunc: fn,
		})
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		k.cancel()
		return nil, fmt.Errorf("starting the components' kubelet on %s: %w", plane.Name, err)
	}
	factory.Start(k.ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), deployments.HasSynced, mutating.HasSynced, validating.HasSynced) {
		k.cancel()
		factory.Shutdown()
		return nil, fmt.Errorf("starting the components' kubelet on %s: informers did not sync: %w", plane.Name, ctx.Err())
	}
	// One worker per component: the queue never hands one component to two workers, and a
	// manager that takes its time to start does not hold up the other component.
	for range k.opts.Deployments {
		k.workers.Go(k.work)
	}
	k.workers.Go(func() {
		<-k.ctx.Done()
		k.queue.ShutDown()
		factory.Shutdown()
	})
	for c := range k.opts.Deployments {
		k.queue.Add(c)
	}
	k.log.Info("components' kubelet started", "deployments", fmt.Sprint(k.opts.Deployments))
	return k, nil
}

func (k *Kubelet) work() {
	for {
		c, shutdown := k.queue.Get()
		if shutdown {
			return
		}
		if err := k.reconcile(k.ctx, c); err != nil && k.ctx.Err() == nil {
			delay := k.backOff(c)
			k.log.Warn("component not running; retrying", "component", c, "in", delay, "err", err)
			k.queue.AddAfter(c, delay)
		}
		k.queue.Done(c)
	}
}

// reconcile brings component c's manager in line with its Deployment: started, rolled out,
// restarted or stopped, its webhooks pointed at it and the Deployment's status written.
func (k *Kubelet) reconcile(ctx context.Context, c Component) error {
	key := k.opts.Deployments[c]
	log := k.log.With("component", c, "deployment", key.String())
	dep, err := k.cs.AppsV1().Deployments(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && dep.Spec.Replicas != nil && *dep.Spec.Replicas == 0) {
		// Deleted, or scaled to zero: no pod runs.
		return k.stopComponent(c, log)
	}
	if err != nil {
		return fmt.Errorf("reading deployment %s: %w", key, err)
	}
	p := k.pod(c)
	fail := func(err error, counts podCounts) error {
		k.mu.Lock()
		p.lastErr = err
		k.mu.Unlock()
		counts.message = summary(err)
		return errors.Join(err, k.writeStatus(ctx, key, counts))
	}

	spec, err := resolve(ctx, k.cs, dep)
	if err != nil {
		return fail(err, podCounts{updated: true, old: k.runningOther(p, "")})
	}
	cur := k.currentOf(p)
	if cur != nil && cur.exited() {
		// Crashed: restarted after a back-off, as a container in a crash loop is.
		k.retire(c, p, cur, log)
		return fail(fmt.Errorf("manager %d exited on its own; restarting it", cur.pid), podCounts{updated: true, hash: spec.hash})
	}
	if cur == nil || cur.spec.hash != spec.hash {
		// Events keep coming while a start waits out its back-off: they wait too.
		if wait := k.waiting(p, spec.hash); wait > 0 {
			k.queue.AddAfter(c, wait)
			if cur == nil {
				return nil
			}
		} else if err := k.rollOut(ctx, c, p, spec, log); err != nil {
			return fail(err, podCounts{updated: true, hash: spec.hash, old: k.runningOther(p, spec.hash)})
		}
	} else {
		k.mu.Lock()
		cur.spec.generation = spec.generation
		k.mu.Unlock()
	}

	cur = k.currentOf(p)
	t := k.target(c, p, cur)
	if err := t.point(ctx, k.cs); err != nil {
		return fail(err, podCounts{updated: true, updatedReady: true, hash: spec.hash})
	}
	k.mu.Lock()
	ready := p.current != nil && p.current.spec.hash == spec.hash
	if ready {
		p.lastErr, p.failures = nil, 0
	}
	k.mu.Unlock()
	return k.writeStatus(ctx, key, podCounts{updated: true, updatedReady: ready, old: !ready, hash: spec.hash, message: "waiting to start the manager again"})
}

// backOff counts a failure of c and returns how long its next start waits: doubling from a
// second up to 30 seconds, as the kubelet's crash-loop back-off does from ten up to five minutes.
func (k *Kubelet) backOff(c Component) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.pods[c]
	if p == nil {
		return backoffBase
	}
	delay := backoffMax
	if p.failures < 16 {
		delay = min(backoffMax, backoffBase<<p.failures)
	}
	p.failures++
	p.retryAt = time.Now().Add(delay)
	return delay
}

// waiting returns how long a start of pod template hash must still wait; a new template starts
// at once.
func (k *Kubelet) waiting(p *pod, hash string) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p.hash != hash {
		return 0
	}
	return max(0, time.Until(p.retryAt))
}

// rollOut starts the manager for spec and makes it current: beside the running one, which stops
// once the new one is ready and the webhooks are pointed at it (RollingUpdate), or after the
// running one has stopped (Recreate). A manager that exited is replaced in place.
func (k *Kubelet) rollOut(ctx context.Context, c Component, p *pod, spec *podSpec, log *slog.Logger) error {
	key := k.opts.Deployments[c]
	k.mu.Lock()
	if p.hash != spec.hash {
		p.hash, p.attempted, p.rolledOut, p.restarts, p.failures = spec.hash, false, false, 0, 0
	}
	if p.attempted {
		p.restarts++
	}
	p.attempted = true
	old := p.current
	k.mu.Unlock()

	if old != nil && (old.exited() || spec.strategy == appsv1.RecreateDeploymentStrategyType) {
		k.retire(c, p, old, log)
		old = nil
	}
	if k.opts.Pull != nil {
		if err := k.opts.Pull(ctx, c, spec.image); err != nil {
			return fmt.Errorf("pulling image %s: %w", spec.image, err)
		}
	}
	if err := k.writeStatus(ctx, key, podCounts{updated: true, old: old != nil, hash: spec.hash, message: "starting the manager"}); err != nil {
		return err
	}
	// A real pod starts seconds after its Deployment, while its image is pulled; here it
	// would start within milliseconds of Helm's apply, before the API server serves the
	// CRDs that came with the chart, and the manager would exit once, as a pod in a
	// crash loop does. Waiting for them stands in for the pull.
	if err := k.crdsServed(ctx, c); err != nil {
		return err
	}
	kubeconfig, err := serviceAccountKubeConfig(ctx, k.cs, k.plane, spec.namespace, spec.serviceAccount)
	if err != nil {
		return err
	}
	log = log.With("podTemplateHash", spec.hash, "image", spec.image)
	log.Info("starting manager", "previous", pidOf(old))
	inst, err := startManager(ctx, c, spec, startParams{
		plane:      k.plane,
		kubeconfig: kubeconfig,
		output:     k.opts.Output,
		log:        log,
		timeout:    k.opts.StartTimeout,
	})
	if err != nil {
		return err
	}
	go func() {
		// A manager that exits on its own is restarted, as restartPolicy Always has it.
		select {
		case <-inst.done:
			k.queue.Add(c)
		case <-k.ctx.Done():
		}
	}()
	k.mu.Lock()
	p.current = inst
	if !p.rolledOut {
		p.rolledOut = true
		p.rollouts++
	}
	k.mu.Unlock()
	log.Info("manager ready", "pid", inst.pid, "webhook", inst.addr, "restarts", p.restarts)

	if old != nil {
		// The new manager takes the webhooks before the old one stops, as a Service moves to
		// the new pod once it is ready.
		if err := k.target(c, p, inst).point(ctx, k.cs); err != nil {
			log.Warn("re-pointing webhooks before stopping the previous manager", "err", err)
		}
		k.retire(c, p, old, log)
	}
	return nil
}

// retire stops a manager that is no longer current and remembers its webhook server, so that
// configurations still pointing at it are re-pointed.
func (k *Kubelet) retire(c Component, p *pod, old *instance, log *slog.Logger) {
	k.mu.Lock()
	p.earlier[old.addr] = true
	if p.current == old {
		p.current = nil
	}
	k.mu.Unlock()
	if err := old.stop(); err != nil {
		// An exit on its own was already logged and counted; the error says so again.
		log.Info("previous manager stopped", "pid", old.pid, "err", err)
		return
	}
	log.Info("previous manager stopped", "pid", old.pid, "component", c)
}

// stopComponent stops c's manager: its Deployment is gone or scaled to zero.
func (k *Kubelet) stopComponent(c Component, log *slog.Logger) error {
	k.mu.Lock()
	p := k.pods[c]
	var cur *instance
	if p != nil {
		cur = p.current
		// A Deployment that comes back starts its history anew; its webhooks may still
		// point at managers of before.
		k.pods[c] = &pod{earlier: p.earlier}
		if cur != nil {
			k.pods[c].earlier[cur.addr] = true
		}
	}
	k.mu.Unlock()
	if cur == nil {
		return nil
	}
	err := cur.stop()
	log.Info("manager stopped: its deployment is gone or scaled to zero", "pid", cur.pid, "err", err)
	return nil
}

func (k *Kubelet) pod(c Component) *pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.pods[c]
	if p == nil {
		p = &pod{earlier: map[string]bool{}}
		k.pods[c] = p
	}
	return p
}

func (k *Kubelet) currentOf(p *pod) *instance {
	k.mu.Lock()
	defer k.mu.Unlock()
	return p.current
}

// runningOther reports whether a manager of another pod template than hash runs and is ready.
func (k *Kubelet) runningOther(p *pod, hash string) bool {
	cur := k.currentOf(p)
	return cur != nil && !cur.exited() && cur.spec.hash != hash
}

// target is where c's webhooks must point: at cur.
func (k *Kubelet) target(c Component, p *pod, cur *instance) *target {
	k.mu.Lock()
	defer k.mu.Unlock()
	earlier := map[string]bool{}
	for a := range p.earlier {
		if a != cur.addr {
			earlier[a] = true
		}
	}
	return &target{namespace: k.opts.Deployments[c].Namespace, addr: cur.addr, ca: cur.ca, earlier: earlier}
}

// writeStatus writes the status of the Deployment as it is now.
func (k *Kubelet) writeStatus(ctx context.Context, key types.NamespacedName, counts podCounts) error {
	dep, err := k.cs.AppsV1().Deployments(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading deployment %s: %w", key, err)
	}
	return writeStatus(ctx, k.cs, dep, counts)
}

// Running returns c's manager as it runs now, and false when none does.
func (k *Kubelet) Running(c Component) (Process, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.pods[c]
	if p == nil || p.current == nil || p.current.exited() {
		return Process{}, false
	}
	in := p.current
	return Process{
		Component:       c,
		Deployment:      k.opts.Deployments[c],
		Pid:             in.pid,
		PodTemplateHash: in.spec.hash,
		Generation:      in.spec.generation,
		Image:           in.spec.image,
		Args:            slices.Clone(in.spec.args),
		Config:          slices.Clone(in.spec.config),
		ServiceAccount:  in.spec.namespace + "/" + in.spec.serviceAccount,
		WebhookAddr:     in.addr,
		Started:         in.started,
		Restarts:        p.restarts,
		Rollouts:        p.rollouts,
	}, true
}

// WaitRunning waits until c's manager runs the pod template that c's Deployment asks for now,
// the Deployment's status says so, every webhook of c is pointed at the manager and the API
// server calls them, and returns the manager. Called right after a Helm install or upgrade, it
// returns the manager of the new template. An error says what was still missing when ctx ended.
func (k *Kubelet) WaitRunning(ctx context.Context, c Component) (Process, error) {
	if _, ok := k.opts.Deployments[c]; !ok {
		return Process{}, fmt.Errorf("waiting for %s: the kubelet does not play it", c)
	}
	var last string
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if k.ctx.Err() != nil {
			return false, errors.New("the kubelet was stopped")
		}
		ok, why, err := k.ready(ctx, c)
		if err != nil {
			if last != "" {
				// A request cut short (by the deadline, or the client's rate limiter
				// near it) says less than what was awaited before.
				return false, nil
			}
			why = err.Error()
		}
		last = why
		return ok, nil
	})
	if err != nil {
		return Process{}, fmt.Errorf("waiting for the %s manager on %s: %w (last: %s)", c, k.plane.Name, err, last)
	}
	p, ok := k.Running(c)
	if !ok {
		return Process{}, fmt.Errorf("waiting for the %s manager on %s: it exited just now", c, k.plane.Name)
	}
	return p, nil
}

// ready reports whether c runs as WaitRunning wants it, and otherwise why not.
func (k *Kubelet) ready(ctx context.Context, c Component) (bool, string, error) {
	key := k.opts.Deployments[c]
	dep, err := k.cs.AppsV1().Deployments(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		return false, "", fmt.Errorf("reading deployment %s: %w", key, err)
	}
	hash, err := templateHash(&dep.Spec.Template)
	if err != nil {
		return false, "", err
	}
	k.mu.Lock()
	p := k.pods[c]
	var cur *instance
	var lastErr error
	if p != nil {
		cur, lastErr = p.current, p.lastErr
	}
	k.mu.Unlock()
	switch {
	case cur == nil || cur.exited():
		return false, fmt.Sprintf("no manager runs for pod template %s (last error: %v)", hash, lastErr), nil
	case cur.spec.hash != hash:
		return false, fmt.Sprintf("the manager runs pod template %s, the deployment asks for %s (last error: %v)", cur.spec.hash, hash, lastErr), nil
	case dep.Status.ObservedGeneration != dep.Generation || dep.Status.UpdatedReplicas != dep.Status.Replicas || dep.Status.AvailableReplicas < dep.Status.UpdatedReplicas:
		return false, fmt.Sprintf("deployment %s is not rolled out: %+v", key, dep.Status), nil
	}
	ok, why, err := k.target(c, p, cur).allPointed(ctx, k.cs)
	if err != nil || !ok {
		return false, why, err
	}
	return probe(ctx, k.plane, c)
}

// Stop stops every manager and the watches, and returns once no process of the Kubelet runs.
// It may be called more than once; every call returns the first one's error.
func (k *Kubelet) Stop() error {
	if k == nil {
		return nil
	}
	k.stopOnce.Do(func() {
		k.cancel()
		k.workers.Wait()
		k.mu.Lock()
		var running []*instance
		for _, p := range k.pods {
			if p.current != nil {
				running = append(running, p.current)
			}
		}
		k.mu.Unlock()
		errs := make([]error, len(running))
		var wg sync.WaitGroup
		for i, in := range running {
			wg.Go(func() { errs[i] = in.stop() })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			k.stopErr = fmt.Errorf("stopping the components' kubelet on %s: %w", k.plane.Name, err)
			return
		}
		k.log.Info("components' kubelet stopped")
	})
	return k.stopErr
}

// summary is the first line of err, at most 512 bytes: a start error carries the manager's last
// output, which has no place in a Deployment's condition.
func summary(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	return msg
}

func pidOf(in *instance) int {
	if in == nil {
		return 0
	}
	return in.pid
}

// crdsServed waits until every CRD of c's API group is established.
func (k *Kubelet) crdsServed(ctx context.Context, c Component) error {
	group := map[Component]string{Kueue: "kueue.x-k8s.io", JobSet: "jobset.x-k8s.io"}[c]
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, k.opts.StartTimeout, true, func(ctx context.Context) (bool, error) {
		list := &apiextensionsv1.CustomResourceDefinitionList{}
		if err := k.plane.Client.List(ctx, list); err != nil {
			last = err.Error()
			return false, nil
		}
		found := false
		for _, crd := range list.Items {
			if crd.Spec.Group != group {
				continue
			}
			found = true
			if !apiextensionshelpers.IsCRDConditionTrue(&crd, apiextensionsv1.Established) {
				last = "CRD " + crd.Name + " is not established"
				return false, nil
			}
		}
		last = "no CRD of " + group
		return found, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the CRDs of %s: %w (last: %s)", c, err, last)
	}
	return nil
}
