package components

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"helm.sh/helm/v4/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	"github.com/flotilla-gitops/flotilla/agent/converge"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/componenttest"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/gobuild"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
	"github.com/flotilla-gitops/flotilla/test/tunneltest"
)

// planes[0] is the hub; planes[1] and planes[2] are workers with neither Kueue nor JobSet,
// one per test, since the components' releases and webhooks are cluster-wide.
var planes []*controlplane.ControlPlane

// bins builds the commands the tests run as processes, into the hub plane's directory.
var (
	bins     gobuild.Cache
	binsOnce sync.Once
)

func TestMain(m *testing.M) {
	// Helm names its field manager once per process. A test that runs the installer
	// in-process stands in for the installer's binary, whose field manager owns what the
	// binary installed before: the same name, or an upgrade would fight over the fields.
	kube.ManagedFieldsManager = installer.FieldManager
	controlplane.Main(m, 3, &planes, controlplane.Options{WithoutComponentCRDs: true})
}

func binary(t *testing.T, name string) string {
	binsOnce.Do(func() { bins.Dir = planes[0].Dir() })
	return bins.Binary(t, name)
}

const (
	agentNamespace = "flotilla-system"
	// workloads is the template fleet's workload namespace, and localQueue the gpu preset's
	// LocalQueue in it.
	workloads   = "ml-training"
	localQueue  = "user-queue"
	clusterQ    = "cluster-queue"
	kueueGroup  = "kueue.x-k8s.io"
	longTimeout = 4 * time.Minute
)

// allowed is what the workers' administrators allow the components' images: the release
// registry, and the mirror an upgrade moves to.
var allowed = components.ImagePolicy{AllowedRegistries: []string{components.DefaultRegistry, "mirror.example.test"}}

// fast liveness, so that a dead tunnel is noticed within a test's patience.
var fast = protocol.Liveness{Interval: 200 * time.Millisecond, Timeout: time.Second}

// world is one worker cluster of the template's fleet, its WorkerCluster on the hub, the
// hub's tunnel, the components' kubelet and the agent.
type world struct {
	t        *testing.T
	worker   *controlplane.ControlPlane
	kubelet  *componenttest.Kubelet
	images   *imageGate
	srv      *tunnel.Server
	key      client.ObjectKey
	identity string
	state    *protocol.DesiredState
	res      *render.Result
	// installer is what the agent's converger runs: the real binary, or Helm in-process
	// with a locally bumped chart.
	installer *switchable
	log       *logtest.Buffer

	connectedAt time.Time
	stopAgent   func()
}

// newWorld starts the kubelet, the hub's side and the agent. name tells the world's
// objects on the hub apart; the held images are not pulled until released.
func newWorld(t *testing.T, name string, worker *controlplane.ControlPlane, held ...string) *world {
	t.Helper()
	ctx := t.Context()
	w := &world{t: t, worker: worker, images: newImageGate(), log: &logtest.Buffer{Max: 1 << 20}}
	for _, image := range held {
		w.images.hold(image)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines of the hub, the agent and the installer:\n%s", w.log.Last(32<<10))
		}
	})
	kubeletOut := &logtest.Buffer{Max: 1 << 20}
	k, err := componenttest.Start(ctx, worker, componenttest.Options{Output: kubeletOut, Log: w.log.Logger(), Pull: w.images.pull})
	if err != nil {
		t.Fatal(err)
	}
	w.kubelet = k
	t.Cleanup(func() {
		w.images.releaseAll()
		if err := k.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("last output of the managers:\n%s", kubeletOut.Last(16<<10))
		}
	})

	// The hub's side: the WorkerCluster the fleet's commit made, and the tunnel.
	f := fleet.Load(gpuFleet())
	c := f.Clusters[fleetgen.ExampleCluster]
	tok, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	w.identity = fleet.Identity(f.Spec.Spec.Tenant, c.Name)
	w.key = client.ObjectKey{Namespace: "tenant-" + name, Name: c.Name}
	if err := planes[0].Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.key.Namespace}}); err != nil {
		t.Fatal(err)
	}
	wc := &v1alpha1.WorkerCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.key.Namespace, Name: w.key.Name, Labels: map[string]string{v1alpha1.WorkerClusterLabel: w.identity}},
		Spec:       *c.Object.Spec.DeepCopy(),
	}
	wc.Spec.EnrollmentTokenHash = tok.Hash().String()
	if err := planes[0].Client.Create(ctx, wc); err != nil {
		t.Fatal(err)
	}
	res, err := render.New().Render(f, c.Name)
	if err != nil {
		t.Fatal(err)
	}
	w.res, w.state = res, desiredState(t, wc.Generation, res)

	srv, err := tunnel.New(tunnel.Options{Client: planes[0].Client, Liveness: fast, AllowInsecureLoopback: true, Log: w.log.Logger().With("side", "hub")})
	if err != nil {
		t.Fatal(err)
	}
	hubURL := tunneltest.Serve(t, srv)
	w.srv = srv
	w.push()

	// The worker's side: the agent's namespace, and the installer it runs.
	if err := worker.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}); err != nil {
		t.Fatal(err)
	}
	kc, err := components.KubeConfigFor(worker.Config)
	if err != nil {
		t.Fatal(err)
	}
	w.installer = &switchable{current: &components.Installer{Binary: binary(t, components.BinaryName), KubeConfig: kc, Stderr: w.log, Images: allowed}}
	w.startAgent(t, hubURL, tok)
	return w
}

// gpuFleet is the template's fleet with its example cluster on the gpu preset, whose
// ClusterQueue Kueue makes Active without a provisioning controller.
func gpuFleet() fstest.MapFS {
	fsys := fleetgen.Template()
	p := "clusters/" + fleetgen.ExampleCluster + "/cluster.yaml"
	fsys[p].Data = []byte(strings.Replace(string(fsys[p].Data), "preset: gke-dws", "preset: gpu", 1))
	return fsys
}

// desiredState is what the hub sends for res, components included.
func desiredState(t *testing.T, generation int64, res *render.Result) *protocol.DesiredState {
	t.Helper()
	comps := res.Components
	ds := &protocol.DesiredState{Generation: generation, Hash: res.Hash, Components: &comps}
	for _, o := range res.Objects {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		ds.Objects = append(ds.Objects, raw)
	}
	return ds
}

// push hands the world's desired state to the hub's tunnel, as the hub's reconciler does
// on a new commit.
func (w *world) push() { w.srv.Push(w.key, w.identity, w.state) }

// change makes the next desired state: edit changes its components, and the hash moves
// as the hub's would.
func (w *world) change(edit func(*components.Spec)) {
	w.t.Helper()
	next := *w.state
	comps := *next.Components
	comps.Frameworks = append([]string(nil), comps.Frameworks...)
	edit(&comps)
	next.Components = &comps
	next.Generation++
	var err error
	if next.Hash, err = render.Hash(w.res.Objects, comps); err != nil {
		w.t.Fatal(err)
	}
	w.state = &next
	w.push()
}

// startAgent runs the agent in-process as its binary would: server-side apply behind the
// converger, with a short readiness wait so that a component that does not answer is
// reported within the test's patience, and tried again every second.
func (w *world) startAgent(t *testing.T, hubURL string, tok secrets.Token) {
	t.Helper()
	log := w.log.Logger().With("side", "agent")
	applier, err := apply.New(apply.Options{Client: w.worker.Client, Identity: w.identity, FieldManager: agent.FieldManager, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	conv, err := converge.New(converge.Options{Client: w.worker.Client, Applier: applier, Installer: w.installer, Images: allowed,
		ReadyTimeout: 5 * time.Second, PollInterval: 200 * time.Millisecond, ProbeNamespace: agentNamespace, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Options{
		HubURL: hubURL, Identity: w.identity, EnrollmentToken: protocol.Secret(tok.Reveal()),
		CredentialSecret: client.ObjectKey{Namespace: agentNamespace, Name: "flotilla-agent-credential"},
		Client:           w.worker.Client, Liveness: fast, Applier: conv, ComponentsRetry: time.Second,
		ApplyTimeout: longTimeout, Log: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	w.stopAgent = func() { cancel(); <-done }
	t.Cleanup(w.stopAgent)
	poll.Until(t, "the agent connects", func() (bool, string) { return a.Connected(), "not connected" })
	w.connectedAt = time.Now()
}

// wc reads the WorkerCluster.
func (w *world) wc() *v1alpha1.WorkerCluster {
	w.t.Helper()
	wc := &v1alpha1.WorkerCluster{}
	if err := planes[0].Client.Get(w.t.Context(), w.key, wc); err != nil {
		w.t.Fatal(err)
	}
	return wc
}

// waitCondition waits, up to within, for the WorkerCluster's condition typ to have status
// and reason at the current desired state, and returns it.
func (w *world) waitCondition(typ string, status metav1.ConditionStatus, reason string, within time.Duration) *v1alpha1.WorkerCluster {
	w.t.Helper()
	var last string
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		wc := w.wc()
		c := meta.FindStatusCondition(wc.Status.Conditions, typ)
		if c != nil && c.Status == status && c.Reason == reason && wc.Status.DesiredHash == w.state.Hash {
			return wc
		}
		if c != nil {
			last = fmt.Sprintf("%s %s: %s (desired %s)", c.Status, c.Reason, c.Message, wc.Status.DesiredHash)
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.t.Fatalf("%s did not become %s/%s in %v; last: %s", typ, status, reason, within, last)
	return nil
}

// imageGate stands in for a registry from which a test can hold images back.
type imageGate struct {
	mu   sync.Mutex
	held map[string]chan struct{}
	// pulled lists the images asked for, in order.
	pulled []string
}

func newImageGate() *imageGate { return &imageGate{held: map[string]chan struct{}{}} }

// hold keeps image from being pulled until release.
func (g *imageGate) hold(image string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[image] = make(chan struct{})
}

func (g *imageGate) release(image string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch, ok := g.held[image]; ok {
		close(ch)
		delete(g.held, image)
	}
}

func (g *imageGate) releaseAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for image, ch := range g.held {
		close(ch)
		delete(g.held, image)
	}
}

// pull is the kubelet's Pull: it waits while the image is held.
func (g *imageGate) pull(ctx context.Context, _ componenttest.Component, image string) error {
	g.mu.Lock()
	g.pulled = append(g.pulled, image)
	ch := g.held[image]
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return errors.New("the test held the image back")
	}
}

// switchable is the installer the agent runs, which a test may swap.
type switchable struct {
	mu      sync.Mutex
	current converge.Installer
}

func (s *switchable) Apply(ctx context.Context, spec components.Spec) (components.Report, error) {
	s.mu.Lock()
	in := s.current
	s.mu.Unlock()
	return in.Apply(ctx, spec)
}

func (s *switchable) use(in converge.Installer) {
	s.mu.Lock()
	s.current = in
	s.mu.Unlock()
}
