package podrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// servicePort names one port of a Service.
type servicePort struct {
	namespace, name string
	port            int32
}

func (s servicePort) String() string { return fmt.Sprintf("%s/%s:%d", s.namespace, s.name, s.port) }

// forwarder plays one port of a Service on a loopback listener.
type forwarder struct {
	r   *Runner
	key servicePort
	l   net.Listener

	mu    sync.Mutex
	next  int
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// ServiceAddr returns the loopback address (host:port) that plays port of Service
// namespace/name, listening from now on: a test can hand it out (as the address of a load
// balancer, or a DNS name's) before the Service exists. A connection made while the Service
// or a ready Pod of it is missing is closed, as kube-proxy rejects it.
func (r *Runner) ServiceAddr(namespace, name string, port int32) (string, error) {
	key := servicePort{namespace: namespace, name: name, port: port}
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.forwarders[key]; ok {
		return f.l.Addr().String(), nil
	}
	if r.ctx.Err() != nil {
		return "", fmt.Errorf("service %s: the pod runner is stopped", key)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("service %s: %w", key, err)
	}
	f := &forwarder{r: r, key: key, l: l, conns: map[net.Conn]struct{}{}}
	r.forwarders[key] = f
	f.wg.Go(f.accept)
	r.balancers.Add(types.NamespacedName{Namespace: namespace, Name: name})
	r.log.Info("service played", "service", key.String(), "addr", l.Addr().String())
	return l.Addr().String(), nil
}

func (f *forwarder) accept() {
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		f.wg.Go(func() { f.serve(c) })
	}
}

// serve forwards one connection to an endpoint of the Service, chosen now.
func (f *forwarder) serve(c net.Conn) {
	defer c.Close()
	addr, pod, err := f.endpoint(f.r.ctx)
	if err != nil {
		f.r.log.Info("service connection refused", "service", f.key.String(), "why", err)
		return
	}
	up, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		f.r.log.Info("service connection refused", "service", f.key.String(), "pod", pod, "err", err)
		return
	}
	defer up.Close()
	if !f.track(c, up) {
		return
	}
	defer f.untrack(c, up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close, so that the other direction finishes what it is sending.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}

func (f *forwarder) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		return false
	}
	for _, c := range cs {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
	}
}

// close stops listening and ends every forwarded connection.
func (f *forwarder) close() {
	_ = f.l.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}

// endpoint picks where a new connection goes: a ready, played Pod that the Service selects
// now and that is not being deleted, in turn when there are several, at the container port
// the Service port's targetPort names. It returns the address and the Pod's name.
func (f *forwarder) endpoint(ctx context.Context) (string, string, error) {
	svc, err := f.r.services.Services(f.key.namespace).Get(f.key.name)
	if apierrors.IsNotFound(err) {
		// The informer may not have seen a Service that was just created.
		svc, err = f.r.cs.CoreV1().Services(f.key.namespace).Get(ctx, f.key.name, metav1.GetOptions{})
	}
	if err != nil {
		return "", "", err
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == f.key.port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return "", "", fmt.Errorf("the service has no port %d", f.key.port)
	}
	if len(svc.Spec.Selector) == 0 {
		return "", "", errors.New("the service selects no pods (endpoints of its own cannot be played)")
	}
	pods, err := f.r.pods.Pods(f.key.namespace).List(labels.SelectorFromSet(svc.Spec.Selector))
	if err != nil {
		return "", "", err
	}
	target := sp.TargetPort
	if target.Type == intstr.Int && target.IntVal == 0 {
		target = intstr.FromInt32(sp.Port)
	}
	type candidate struct{ pod, addr string }
	var ready []candidate
	for _, obj := range pods {
		if obj.DeletionTimestamp != nil {
			continue
		}
		f.r.mu.Lock()
		p := f.r.running[types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}]
		f.r.mu.Unlock()
		if p == nil || !p.isReady() {
			continue
		}
		if addr, ok := p.addrOf(target.IntVal, target.StrVal); ok {
			ready = append(ready, candidate{obj.Name, addr})
		}
	}
	if len(ready) == 0 {
		return "", "", fmt.Errorf("no ready pod matches %v", svc.Spec.Selector)
	}
	slices.SortFunc(ready, func(a, b candidate) int {
		switch {
		case a.pod < b.pod:
			return -1
		case a.pod > b.pod:
			return 1
		}
		return 0
	})
	f.mu.Lock()
	c := ready[f.next%len(ready)]
	f.next++
	f.mu.Unlock()
	return c.addr, c.pod, nil
}

// balance writes the load balancer's address into the status of the LoadBalancer Services
// the Runner plays a port of: 127.0.0.1, where ServiceAddr listens (on a port of its own,
// which a test hands out).
func (r *Runner) balance() {
	for {
		key, shutdown := r.balancers.Get()
		if shutdown {
			return
		}
		if err := r.publishBalancer(r.ctx, key); err != nil && r.ctx.Err() == nil {
			r.log.Warn("writing a load balancer's address; retrying", "service", key.String(), "err", err)
			r.balancers.AddAfter(key, time.Second)
		}
		r.balancers.Done(key)
	}
}

func (r *Runner) publishBalancer(ctx context.Context, key types.NamespacedName) error {
	r.mu.Lock()
	played := false
	for k := range r.forwarders {
		if k.namespace == key.Namespace && k.name == key.Name {
			played = true
		}
	}
	r.mu.Unlock()
	if !played {
		return nil
	}
	svc, err := r.cs.CoreV1().Services(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || len(svc.Status.LoadBalancer.Ingress) > 0 {
		return nil
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "127.0.0.1"}}
	_, err = r.cs.CoreV1().Services(key.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{FieldManager: fieldManager})
	if apierrors.IsConflict(err) {
		r.balancers.Add(key)
		return nil
	}
	return err
}
