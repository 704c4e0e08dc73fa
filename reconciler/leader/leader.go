// Package leader runs the hub's work on one replica at a time and routes to that replica.
//
// The replicas of a hub compete for a Lease; the holder serves the agents' tunnels, the
// API proxy and the webhooks. Readiness says only that a replica is healthy, so that a
// rolling update and a node drain never wait for a Lease to move; what must reach the
// leader reaches it through Services that select Label, which the leader sets on its own
// Pod once it serves and takes off every other Pod.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Label marks the Pod of the leading replica with the value "true". The hub chart's
// Services for the tunnel, the API proxy and the webhooks select it.
const Label = "flotilla.dev/hub-leader"

// Options configure an Elector.
type Options struct {
	// Config reaches the hub cluster.
	Config *rest.Config
	// Namespace and Name of the Lease.
	Namespace, Name string
	// Pod and PodNamespace name this replica's Pod, from the downward API. Empty outside
	// Kubernetes: nothing is labelled then. PodNamespace defaults to Namespace.
	Pod, PodNamespace string
	// Identity is this replica's name in the Lease. Default: the Pod's name, else the
	// host's name and the process ID.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's; defaults 15 s, 10 s
	// and 2 s, so a replica that dies unannounced is replaced within about 17 s and one
	// that stops is replaced within RetryPeriod.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       *slog.Logger
}

// Elector runs a function while this replica holds the Lease.
type Elector struct {
	opts Options
	pods kubernetes.Interface
	lock resourcelock.Interface
}

// New returns an Elector; it does not contact the API server yet.
func New(opts Options) (*Elector, error) {
	if opts.Namespace == "" || opts.Name == "" {
		return nil, errors.New("leader election: the Lease's namespace and name are required")
	}
	if opts.PodNamespace == "" {
		opts.PodNamespace = opts.Namespace
	}
	if opts.Identity == "" {
		opts.Identity = opts.Pod
	}
	if opts.Identity == "" {
		host, _ := os.Hostname()
		opts.Identity = fmt.Sprintf("%s_%d", host, os.Getpid())
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 15 * time.Second
	}
	if opts.RenewDeadline == 0 {
		opts.RenewDeadline = 10 * time.Second
	}
	if opts.RetryPeriod == 0 {
		opts.RetryPeriod = 2 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	cs, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, opts.Namespace, opts.Name, cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: opts.Identity})
	if err != nil {
		return nil, err
	}
	return &Elector{opts: opts, pods: cs, lock: lock}, nil
}

// Identity is this replica's name in the Lease.
func (e *Elector) Identity() string { return e.opts.Identity }

// Run waits for the Lease and runs lead while it is held; lead should call Serving once
// it accepts connections. Run returns nil when ctx ends, lead's error when it fails, and
// an error when the Lease was lost while leading, so that the replica's supervisor
// restarts it as a follower rather than leaving a replica that believes it leads.
func (e *Elector) Run(ctx context.Context, lead func(context.Context) error) error {
	// A container restarted in the Pod that led must not keep drawing the leader's
	// traffic while it follows.
	if err := e.unmark(ctx, e.opts.Pod); err != nil {
		return err
	}
	log := e.opts.Log
	// client-go calls OnStartedLeading in a goroutine it does not wait for: lead runs
	// here instead, so that the label comes off before the Lease is released and lead
	// has stopped when Run returns.
	election, stop := context.WithCancel(ctx)
	defer stop()
	acquired := make(chan context.Context, 1)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		leaderelection.RunOrDie(election, leaderelection.LeaderElectionConfig{
			Lock: e.lock, ReleaseOnCancel: true,
			LeaseDuration: e.opts.LeaseDuration, RenewDeadline: e.opts.RenewDeadline, RetryPeriod: e.opts.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(leading context.Context) { acquired <- leading },
				OnStoppedLeading: func() { log.Info("stopped leading") },
				OnNewLeader: func(leader string) {
					if leader != e.opts.Identity {
						log.Info("another replica leads; waiting", "leader", leader)
					}
				},
			},
		})
	}()
	var leading context.Context
	select {
	case <-ended:
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("leader election ended before this replica led")
	case leading = <-acquired:
	}
	log.Info("leading", "lease", e.opts.Namespace+"/"+e.opts.Name, "identity", e.opts.Identity)
	leadErr := lead(leading)
	lost := ctx.Err() == nil && leading.Err() != nil
	off, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.RenewDeadline)
	defer cancel()
	if err := e.unmark(off, e.opts.Pod); err != nil {
		log.Error("taking the leader label off this replica's Pod", "pod", e.opts.Pod, "error", err)
	}
	stop()
	<-ended
	switch {
	case ctx.Err() != nil:
		return nil
	case lost:
		return errors.New("lost the leader election lease")
	case leadErr != nil:
		return leadErr
	default:
		return errors.New("stopped leading with the lease held")
	}
}

// Serving routes the leader's traffic to this replica: every other Pod in its namespace
// loses Label (a leader that died keeps it until it is replaced), then this Pod gains it.
func (e *Elector) Serving(ctx context.Context) error {
	if e.opts.Pod == "" {
		return nil
	}
	pods, err := e.pods.CoreV1().Pods(e.opts.PodNamespace).List(ctx, metav1.ListOptions{LabelSelector: Label + "=true"})
	if err != nil {
		return fmt.Errorf("listing the Pods labelled %s in %s: %w", Label, e.opts.PodNamespace, err)
	}
	for _, p := range pods.Items {
		if p.Name != e.opts.Pod {
			if err := e.unmark(ctx, p.Name); err != nil {
				return err
			}
			e.opts.Log.Info("took the leader label off a former leader's Pod", "pod", p.Name)
		}
	}
	if err := e.patch(ctx, e.opts.Pod, `"true"`); err != nil {
		return err
	}
	e.opts.Log.Info("this replica's Pod is labelled leader", "pod", e.opts.Pod, "label", Label)
	return nil
}

func (e *Elector) unmark(ctx context.Context, pod string) error {
	if pod == "" {
		return nil
	}
	err := e.patch(ctx, pod, "null")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (e *Elector) patch(ctx context.Context, pod, value string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, Label, value)
	if _, err := e.pods.CoreV1().Pods(e.opts.PodNamespace).Patch(ctx, pod, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling Pod %s/%s %s=%s: %w", e.opts.PodNamespace, pod, Label, value, err)
	}
	return nil
}
