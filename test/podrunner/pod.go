package podrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
)

const (
	// defaultContainerAnnotation names the main container of a multi-container pod
	// (kubectl's convention).
	defaultContainerAnnotation = "kubectl.kubernetes.io/default-container"
	// probeInterval is how often the readiness probe runs: more often than the charts'
	// periodSeconds, so that a test waits no longer than it must.
	probeInterval = 500 * time.Millisecond
	// The back-off between the starts of a process that exited or could not start, as the
	// kubelet's crash-loop back-off but shorter: a test waits for it.
	backoffBase, backoffMax, backoffReset = time.Second, 30 * time.Second, 30 * time.Second
	// defaultGrace is the termination grace period when the Pod gives none, as Kubernetes'.
	defaultGrace = 30 * time.Second
)

// pod is one played replica: its Pod object and the process behind it. Its lifecycle
// goroutine alone starts and stops the process; the fields under mu are read by the
// forwarders, the reconcile and tests.
type pod struct {
	r          *Runner
	key        types.NamespacedName
	deployment types.NamespacedName
	hash       string
	seq        int
	obj        *corev1.Pod // as created
	container  corev1.Container
	dir        string
	grace      time.Duration

	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	pid      int
	ready    bool
	started  time.Time
	restarts int
	ports    map[int32]string
	names    map[string]int32
	// waiting says why no process runs (a missing image, a volume that cannot be made, a
	// crash), for the Pod's status.
	waitReason, waitMessage string
}

// templateHash hashes a pod template as the deployment controller does for its
// pod-template-hash label (FNV-32a, encoded with the same safe alphabet), here over the
// template's JSON: any change of the template changes it.
func templateHash(t *corev1.PodTemplateSpec) (string, error) {
	data, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("hashing pod template: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write(data)
	return rand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10)), nil
}

// mainContainer is the container the Runner plays: the one the default-container
// annotation names, else the first.
func mainContainer(t *corev1.PodTemplateSpec) (corev1.Container, error) {
	if len(t.Spec.Containers) == 0 {
		return corev1.Container{}, errors.New("the pod template has no container")
	}
	if name := t.Annotations[defaultContainerAnnotation]; name != "" {
		for _, c := range t.Spec.Containers {
			if c.Name == name {
				return c, nil
			}
		}
	}
	return t.Spec.Containers[0], nil
}

// createPod creates a Pod of dep's template, as the deployment controller's ReplicaSet would,
// bound to the Runner's node as the scheduler would, and starts playing it.
func (r *Runner) createPod(ctx context.Context, dep *appsv1.Deployment, hash string) (*pod, error) {
	tmpl := dep.Spec.Template.DeepCopy()
	c, err := mainContainer(tmpl)
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	if err := r.publishRootCA(ctx, dep.Namespace); err != nil {
		return nil, err
	}
	labels := maps.Clone(tmpl.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[appsv1.DefaultDeploymentUniqueLabelKey] = hash
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("%s-%s-%s", dep.Name, hash, rand.String(5)),
			Namespace:   dep.Namespace,
			Labels:      labels,
			Annotations: tmpl.Annotations,
		},
		Spec: tmpl.Spec,
	}
	obj.Spec.NodeName = r.node
	created, err := r.cs.CoreV1().Pods(dep.Namespace).Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("creating a pod of deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	key := types.NamespacedName{Namespace: created.Namespace, Name: created.Name}
	dir := filepath.Join(r.plane.Dir(), "pods", created.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pod %s: %w", key, err)
	}
	grace := defaultGrace
	if s := created.Spec.TerminationGracePeriodSeconds; s != nil {
		grace = time.Duration(*s) * time.Second
	}
	pctx, cancel := context.WithCancel(r.ctx)
	p := &pod{r: r, key: key, deployment: types.NamespacedName{Namespace: dep.Namespace, Name: dep.Name}, hash: hash,
		obj: created, container: c, dir: dir, grace: grace, cancel: cancel, done: make(chan struct{}),
		waitReason: "ContainerCreating"}
	r.mu.Lock()
	r.seq++
	p.seq = r.seq
	r.running[key] = p
	r.mu.Unlock()
	r.log.Info("pod created", "pod", key.String(), "deployment", p.deployment.String(), "podTemplateHash", hash)
	go p.run(pctx)
	return p, nil
}

// publishRootCA creates the ConfigMap kube-root-ca.crt in namespace when it is missing, as
// kube-controller-manager's root CA publisher does in every namespace: the projected volume
// of a Pod's ServiceAccount token names it.
func (r *Runner) publishRootCA(ctx context.Context, namespace string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: namespace},
		Data: map[string]string{"ca.crt": string(r.plane.Config.CAData)}}
	_, err := r.cs.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("publishing the root CA in namespace %s: %w", namespace, err)
	}
	return nil
}

// terminate stops p as the kubelet stops a deleted Pod: the Pod is marked for deletion,
// the process gets SIGTERM and, after the grace period, SIGKILL, and then the Pod object is
// removed. why is logged.
func (r *Runner) terminate(ctx context.Context, p *pod, why string) {
	err := r.cs.CoreV1().Pods(p.key.Namespace).Delete(ctx, p.key.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		r.log.Warn("marking pod for deletion", "pod", p.key.String(), "err", err)
	}
	p.stop()
	err = r.cs.CoreV1().Pods(p.key.Namespace).Delete(ctx, p.key.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		r.log.Warn("deleting pod", "pod", p.key.String(), "err", err)
	}
	r.mu.Lock()
	delete(r.running, p.key)
	r.mu.Unlock()
	r.log.Info("pod stopped", "pod", p.key.String(), "why", why)
}

// stop ends the lifecycle goroutine, which stops the process, and waits for it.
func (p *pod) stop() {
	p.cancel()
	<-p.done
}

func (p *pod) isReady() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

func (p *pod) snapshot() Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Pod{Name: p.key.Name, Deployment: p.deployment, Pid: p.pid, Ready: p.ready, Restarts: p.restarts, Ports: maps.Clone(p.ports)}
}

// addrOf is the loopback address of the container port that target names (a number, or a
// port's name), and false when the process does not serve it.
func (p *pod) addrOf(port int32, name string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if name != "" {
		n, ok := p.names[name]
		if !ok {
			return "", false
		}
		port = n
	}
	a, ok := p.ports[port]
	return a, ok
}

// run is the Pod's lifecycle: prepare the container once, then run its process again and
// again (restartPolicy Always) until the Pod is stopped.
func (p *pod) run(ctx context.Context) {
	defer close(p.done)
	log := p.r.log.With("pod", p.key.String())
	var spec *containerSpec
	failures, ran := 0, false
	for ctx.Err() == nil {
		var err error
		if spec == nil {
			spec, err = p.prepare(ctx, log)
		}
		if err == nil {
			if ran {
				p.mu.Lock()
				p.restarts++
				p.mu.Unlock()
			}
			ran = true
			began := time.Now()
			err = p.runProcess(ctx, spec, log)
			if err == nil && ctx.Err() == nil {
				err = errors.New("exited with status 0")
			}
			// A process that ran a while before it ended starts its back-off anew, as the
			// kubelet resets it after ten minutes; a test waits seconds.
			if time.Since(began) > backoffReset {
				failures = 0
			}
		}
		if ctx.Err() != nil {
			return
		}
		failures++
		delay := min(backoffBase<<min(failures-1, 5), backoffMax)
		reason := "CrashLoopBackOff"
		var ce *configError
		if errors.As(err, &ce) {
			reason = ce.reason
		}
		log.Warn("container not running; retrying", "in", delay, "reason", reason, "err", err)
		p.setWaiting(reason, err.Error())
		p.writeStatus(ctx)
		p.r.queue.Add(p.deployment)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// runProcess runs the container's process until it exits or ctx ends, probing its
// readiness meanwhile. It returns why the process ended.
func (p *pod) runProcess(ctx context.Context, spec *containerSpec, log *slog.Logger) error {
	proc, err := startProcess(spec, p.dir, newPrefixWriter(p.r.opts.Output, p.key.Name+": "))
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.pid, p.started, p.ready, p.waitReason, p.waitMessage = proc.pid(), time.Now(), false, "", ""
	p.mu.Unlock()
	log.Info("process started", "pid", proc.pid(), "binary", spec.binary, "args", fmt.Sprint(spec.args))
	p.writeStatus(ctx)

	ticker := time.NewTicker(probeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			p.setReady(false)
			err := proc.stop(p.grace)
			log.Info("process stopped", "pid", proc.pid(), "err", err)
			p.mu.Lock()
			p.pid = 0
			p.mu.Unlock()
			return nil
		case <-proc.done:
			p.setReady(false)
			p.mu.Lock()
			p.pid = 0
			p.mu.Unlock()
			return fmt.Errorf("process %d exited: %w", proc.pid(), proc.err)
		case <-ticker.C:
			ok := probe(ctx, spec.readiness, p)
			if ok != p.isReady() {
				p.setReady(ok)
				log.Info("readiness changed", "ready", ok)
				p.writeStatus(ctx)
				p.r.queue.Add(p.deployment)
			}
		}
	}
}

func (p *pod) setReady(ready bool) {
	p.mu.Lock()
	p.ready = ready
	p.mu.Unlock()
}

func (p *pod) setWaiting(reason, message string) {
	p.mu.Lock()
	p.waitReason, p.waitMessage = reason, summary(message)
	p.mu.Unlock()
}

// writeStatus writes the Pod's status as the kubelet reports it: Running with the
// container's state, Ready from the readiness probe, the loopback address as the Pod's IP.
func (p *pod) writeStatus(ctx context.Context) {
	p.mu.Lock()
	ready, pid, started, restarts := p.ready, p.pid, p.started, p.restarts
	reason, message := p.waitReason, p.waitMessage
	p.mu.Unlock()
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.Now()}
	}
	cs := corev1.ContainerStatus{Name: p.container.Name, Image: p.container.Image, Ready: ready, RestartCount: int32(restarts), Started: ptr.To(pid != 0)}
	phase := corev1.PodRunning
	if pid != 0 {
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}
	} else {
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: message}
		if restarts == 0 && started.IsZero() {
			phase = corev1.PodPending
		}
	}
	st := corev1.PodStatus{
		Phase:     phase,
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:     "127.0.0.1",
		PodIPs:    []corev1.PodIP{{IP: "127.0.0.1"}},
		StartTime: ptr.To(p.obj.CreationTimestamp),
		Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true),
			cond(corev1.ContainersReady, ready), cond(corev1.PodReady, ready),
		},
		ContainerStatuses: []corev1.ContainerStatus{cs},
	}
	patch, err := json.Marshal(map[string]any{"status": st})
	if err == nil {
		_, err = p.r.cs.CoreV1().Pods(p.key.Namespace).Patch(ctx, p.key.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	}
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		p.r.log.Warn("writing pod status", "pod", p.key.String(), "err", err)
	}
}

// summary is the first 512 bytes of msg: a start error carries a process's last output,
// which has no place in a Pod's status.
func summary(msg string) string {
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	return msg
}
