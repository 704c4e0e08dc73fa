package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/inventory"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// planes[0] is the hub, planes[1] and planes[2] are workers.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	if spec := os.Getenv(simEnv); spec != "" {
		os.Exit(simulateAgents(spec))
	}
	controlplane.Main(m, 3, &planes, controlplane.Options{})
}

func listenLoopback() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func hub() client.Client    { return planes[0].Client }
func worker() client.Client { return planes[1].Client }

// fast liveness, so a dead peer is noticed within a test's patience.
var fast = protocol.Liveness{Interval: 200 * time.Millisecond, Timeout: time.Second}

// rendered is the template's example cluster as the hub renders it, with changes made
// to its objects by edit.
func rendered(t testing.TB, generation int64, edit func([]*unstructured.Unstructured) []*unstructured.Unstructured) (*protocol.DesiredState, *render.Result) {
	t.Helper()
	f := fleet.Load(fleetgen.Template())
	res, err := render.New().Render(f, fleetgen.ExampleCluster)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		res.Objects = edit(res.Objects)
		if res.Hash, err = render.Hash(res.Objects, res.Components); err != nil {
			t.Fatal(err)
		}
	}
	ds := &protocol.DesiredState{Generation: generation, Hash: res.Hash}
	for _, o := range res.Objects {
		raw, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		ds.Objects = append(ds.Objects, raw)
	}
	return ds, res
}

// fleetCase is one enrolled worker: its WorkerCluster on the hub, its token, and the
// namespaces its agent uses on the worker.
type fleetCase struct {
	t        testing.TB
	name     string
	ns       string // tenant namespace on the hub
	identity string
	token    secrets.Token
	agentNS  string // the agent's namespace on the worker
	state    *protocol.DesiredState
	res      *render.Result
}

// newCase creates the WorkerCluster a fleet repository with the template's example
// cluster would give, with a fresh enrollment token.
func newCase(t testing.TB, name string) *fleetCase {
	t.Helper()
	ctx := t.Context()
	f := fleet.Load(fleetgen.Template())
	tok, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	c := &fleetCase{t: t, name: name, ns: "tenant-" + name, identity: fleet.Identity(f.Spec.Spec.Tenant, fleetgen.ExampleCluster), token: tok, agentNS: "flotilla-" + name}
	for _, ns := range []struct {
		c    client.Client
		name string
	}{{hub(), c.ns}, {worker(), c.agentNS}} {
		if err := ns.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.name}}); err != nil {
			t.Fatal(err)
		}
	}
	wc := &v1alpha1.WorkerCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: fleetgen.ExampleCluster, Labels: map[string]string{v1alpha1.WorkerClusterLabel: c.identity}},
		Spec:       *f.Clusters[fleetgen.ExampleCluster].Object.Spec.DeepCopy(),
	}
	wc.Spec.EnrollmentTokenHash = tok.Hash().String()
	if err := hub().Create(ctx, wc); err != nil {
		t.Fatal(err)
	}
	c.state, c.res = rendered(t, 1, nil)
	t.Cleanup(func() { c.cleanup() })
	return c
}

// cleanup removes what the case put on the worker, which is shared by the tests: the
// worker has no namespace controller, so cluster-scoped objects are deleted one by one.
// push hands the case's current desired state to the hub's tunnel, as the hub's
// reconciler does on a new head, and reports whether the agent was connected.
func (c *fleetCase) push(h *hubServer) bool {
	return h.srv.Push(client.ObjectKey{Namespace: c.ns, Name: fleetgen.ExampleCluster}, c.identity, c.state)
}

func (c *fleetCase) cleanup() {
	ctx := context.Background()
	for _, gvk := range apply.PruneKinds() {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := worker().List(ctx, &list); err != nil {
			continue
		}
		for i := range list.Items {
			if gvk.Kind != "Namespace" {
				_ = worker().Delete(ctx, &list.Items[i])
			}
		}
	}
	_ = hub().DeleteAllOf(ctx, &v1alpha1.WorkerCluster{}, client.InNamespace(c.ns))
}

// deleteOwned deletes from the worker what an identity's agent applied and left there.
func deleteOwned(identity string) {
	ctx := context.Background()
	for _, gvk := range apply.PruneKinds() {
		if gvk.Kind == "Namespace" {
			continue
		}
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := worker().List(ctx, &list, client.MatchingLabels{v1alpha1.WorkerClusterLabel: identity}); err != nil {
			continue
		}
		for i := range list.Items {
			_ = worker().Delete(ctx, &list.Items[i])
		}
	}
}

func (c *fleetCase) wc() *v1alpha1.WorkerCluster {
	c.t.Helper()
	var wc v1alpha1.WorkerCluster
	if err := hub().Get(c.t.Context(), types.NamespacedName{Namespace: c.ns, Name: fleetgen.ExampleCluster}, &wc); err != nil {
		c.t.Fatal(err)
	}
	return &wc
}

// hubServer is a hub's tunnel endpoint on a loopback address that survives restarts.
type hubServer struct {
	t      testing.TB
	addr   string
	srv    *tunnel.Server
	http   *http.Server
	log    *logtest.Buffer
	opts   tunnel.Options
	closed chan struct{}
	// c is the case whose desired state the hub pushes, when it serves one.
	c *fleetCase
}

func startHub(t testing.TB, c *fleetCase, mod func(*tunnel.Options)) *hubServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hubServer{t: t, addr: l.Addr().String(), log: &logtest.Buffer{}, c: c}
	h.opts = tunnel.Options{Client: hub(), Liveness: fast, AllowInsecureLoopback: true, Log: h.log.Logger()}
	if mod != nil {
		mod(&h.opts)
	}
	h.serve(l)
	t.Cleanup(h.stop)
	return h
}

func (h *hubServer) serve(l net.Listener) {
	srv, err := tunnel.New(h.opts)
	if err != nil {
		h.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(protocol.Path, srv)
	h.srv, h.http, h.closed = srv, &http.Server{Handler: mux}, make(chan struct{})
	if h.c != nil {
		// As a hub's first sync does, before its agents redial.
		h.c.push(h)
	}
	go func() { _ = h.http.Serve(l); close(h.closed) }()
}

func (h *hubServer) stop() {
	// The listener and every tunnel at once, as when the hub's process ends.
	_ = h.http.Close()
	<-h.closed
	h.srv.Close()
}

// restart stops the hub and starts a new one, with no memory of the old, on the same
// address.
func (h *hubServer) restart() {
	h.stop()
	l, err := net.Listen("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.serve(l)
}

func (h *hubServer) url() string { return "ws://" + h.addr }

// runAgent runs an agent of the case against the hub until the returned stop is
// called (or the test ends).
func runAgent(t testing.TB, c *fleetCase, h *hubServer, withToken bool, mod func(*agent.Options)) (stop func(), log *logtest.Buffer) {
	t.Helper()
	log = &logtest.Buffer{}
	ap, err := apply.New(apply.Options{Client: worker(), Identity: c.identity})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.NewCollector(inventory.Options{Client: worker()})
	if err != nil {
		t.Fatal(err)
	}
	opts := agent.Options{
		HubURL: h.url(), Identity: c.identity,
		CredentialSecret: types.NamespacedName{Namespace: c.agentNS, Name: "flotilla-agent-credential"},
		Client:           worker(), Liveness: fast, Applier: ap, Inventory: inv,
		Backoff:      wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: time.Second},
		AgentVersion: "test", KubernetesVersion: "v1.37.2", Log: log.Logger(),
	}
	if withToken {
		opts.EnrollmentToken = protocol.Secret(c.token.Reveal())
	}
	if mod != nil {
		mod(&opts)
	}
	a, err := agent.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop, log
}

// eventually waits for cond, as every test of the package does.
var eventually = poll.Until

func condition(wc *v1alpha1.WorkerCluster, typ string) *metav1.Condition {
	for i := range wc.Status.Conditions {
		if wc.Status.Conditions[i].Type == typ {
			return &wc.Status.Conditions[i]
		}
	}
	return nil
}

// conditionIs waits for a condition of the case's WorkerCluster.
func (c *fleetCase) conditionIs(typ string, status metav1.ConditionStatus, reason string) *v1alpha1.WorkerCluster {
	c.t.Helper()
	var wc *v1alpha1.WorkerCluster
	eventually(c.t, fmt.Sprintf("%s=%s (%s)", typ, status, reason), func() (bool, string) {
		wc = c.wc()
		cond := condition(wc, typ)
		if cond == nil {
			return false, "no condition"
		}
		return cond.Status == status && (reason == "" || cond.Reason == reason), fmt.Sprintf("%s %s: %s", cond.Status, cond.Reason, cond.Message)
	})
	return wc
}

// configured waits until the worker applied the case's current desired state.
func (c *fleetCase) configured() *v1alpha1.WorkerCluster {
	c.t.Helper()
	var wc *v1alpha1.WorkerCluster
	eventually(c.t, "the desired state applied", func() (bool, string) {
		wc = c.wc()
		cond := condition(wc, v1alpha1.ConditionWorkerConfigured)
		if cond == nil {
			return false, "no WorkerConfigured"
		}
		return cond.Status == metav1.ConditionTrue && wc.Status.AppliedHash == c.state.Hash, fmt.Sprintf("%s %s: %s; applied %s", cond.Status, cond.Reason, cond.Message, wc.Status.AppliedHash)
	})
	return wc
}

func notContains(t *testing.T, what, text, secret string) {
	t.Helper()
	if secret != "" && strings.Contains(text, secret) {
		t.Fatalf("%s contains a secret", what)
	}
}

// link is a TCP relay to the hub that a test can freeze: while frozen, bytes are read
// and dropped in both directions, so each side sees a peer that went silent.
type link struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	frozen bool
	n      int
}

func newLink(t *testing.T, target string) *link {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &link{l: l, target: target}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			k.mu.Lock()
			k.n++
			k.mu.Unlock()
			go k.pipe(in, out)
			go k.pipe(out, in)
		}
	}()
	return k
}

func (k *link) pipe(from, to net.Conn) {
	defer from.Close()
	defer to.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return
		}
		k.mu.Lock()
		frozen := k.frozen
		k.mu.Unlock()
		if frozen {
			continue
		}
		if _, err := to.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (k *link) freeze()     { k.mu.Lock(); k.frozen = true; k.mu.Unlock() }
func (k *link) thaw()       { k.mu.Lock(); k.frozen = false; k.mu.Unlock() }
func (k *link) conns() int  { k.mu.Lock(); defer k.mu.Unlock(); return k.n }
func (k *link) url() string { return "ws://" + k.l.Addr().String() }
