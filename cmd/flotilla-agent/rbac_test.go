package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

const (
	agentNamespace = "flotilla-system"
	// agentUser is the chart's ServiceAccount of a release named flotilla-agent.
	agentUser     = "system:serviceaccount:" + agentNamespace + ":flotilla-agent"
	agentIdentity = "4-acme-gpu-a"
)

// dispatchUser is the chart's dispatch ServiceAccount, which the agent's proxy
// impersonates.
const dispatchUser = "system:serviceaccount:" + agentNamespace + ":" + proxy.DefaultServiceAccount

// dispatchClusterRole is the chart's ClusterRole of the dispatch identity's namespaced
// rules, which the agent binds in the workload namespaces, for a release named
// flotilla-agent.
const dispatchClusterRole = "flotilla-agent-dispatch"

// installChartRBAC creates the chart's ServiceAccounts, ClusterRoles, Roles and their
// bindings on the plane, those that are not there yet, and waits until the authorizer
// grants them.
func installChartRBAC(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	admin := planes[0].Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}
	if err := admin.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var objs []client.Object
	for _, name := range []string{"serviceaccount.yaml", "clusterrole.yaml", "role.yaml", "dispatch.yaml"} {
		docs := renderRBAC(t, name, agentNamespace)
		for _, doc := range docs {
			var obj client.Object
			switch doc["kind"] {
			case "ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "Role":
				obj = &rbacv1.Role{}
			case "RoleBinding":
				obj = &rbacv1.RoleBinding{}
			default:
				t.Fatalf("templates/%s: unexpected %v", name, doc["kind"])
			}
			decodeInto(t, doc, obj)
			objs = append(objs, obj)
		}
	}
	for _, obj := range objs {
		if err := admin.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
	// The RBAC authorizer learns of roles and bindings through its informers, a moment
	// after they are stored: wait for the last rule of each to be granted.
	for _, g := range []struct {
		user  string
		attrs authorizationv1.ResourceAttributes
	}{
		{agentUser, authorizationv1.ResourceAttributes{Group: "kueue.x-k8s.io", Resource: "localqueues", Verb: "delete"}},
		{agentUser, authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "patch", Namespace: agentNamespace, Name: defaultCredentialSecret}},
		{agentUser, authorizationv1.ResourceAttributes{Resource: "serviceaccounts", Verb: "impersonate", Namespace: agentNamespace, Name: proxy.DefaultServiceAccount}},
		{dispatchUser, authorizationv1.ResourceAttributes{Group: "jobset.x-k8s.io", Resource: "jobsets", Verb: "watch"}},
		{agentUser, authorizationv1.ResourceAttributes{Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Verb: "bind", Name: dispatchClusterRole}},
	} {
		user, attrs := g.user, g.attrs
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
			if err := admin.Create(ctx, review); err != nil {
				return false, err
			}
			return review.Status.Allowed, nil
		})
		if err != nil {
			t.Fatalf("waiting for %s to be granted %+v: %v", user, attrs, err)
		}
	}
}

// agentKubeconfig writes the plane's kubeconfig acting as the chart's ServiceAccount.
func agentKubeconfig(t *testing.T) string {
	t.Helper()
	kc, err := clientcmd.Load(planes[0].KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = agentUser
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// hubSide is the hub's end of one tunnel: enough of a hub to drive the agent.
type hubSide struct {
	conn *protocol.Conn
	tun  *protocol.Tunnel
	msgs chan any
}

// next returns the next message of type T, skipping heartbeats and the other periodic
// messages.
func next[T any](t *testing.T, h *hubSide) *T {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		select {
		case m, ok := <-h.msgs:
			if !ok {
				t.Fatalf("the tunnel closed while waiting for a %T", new(T))
			}
			if v, ok := m.(*T); ok {
				return v
			}
		case <-ctx.Done():
			t.Fatalf("no %T from the agent", new(T))
		}
	}
}

// fakeHub admits the agent's enrollment token once, issuing credential, and hands each
// tunnel to the test. It answers the upgrade as a hub of protocol version 1 would, with no
// version.
func fakeHub(t *testing.T, credential string) (*httptest.Server, <-chan *hubSide) {
	t.Helper()
	return fakeHubSpeaking(t, credential, 0)
}

// fakeHubSpeaking is fakeHub answering the upgrade with protocol version, unless it is 0.
func fakeHubSpeaking(t *testing.T, credential string, version int) (*httptest.Server, <-chan *hubSide) {
	t.Helper()
	tunnels := make(chan *hubSide, 1)
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != protocol.Path || r.Header.Get("Authorization") != "Bearer "+token ||
			r.Header.Get(protocol.HeaderAuth) != protocol.AuthEnrollment || r.Header.Get(protocol.HeaderIdentity) != agentIdentity {
			t.Errorf("hub: unexpected dial %s %s as %q", r.URL.Path, r.Header.Get(protocol.HeaderAuth), r.Header.Get(protocol.HeaderIdentity))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		answer := http.Header{protocol.HeaderCredential: {credential}}
		if version != 0 {
			answer.Set(protocol.HeaderProtocol, strconv.Itoa(version))
		}
		ws, err := up.Upgrade(w, r, answer)
		if err != nil {
			t.Errorf("hub: upgrade: %v", err)
			return
		}
		tun, err := protocol.NewTunnel(ws, false, protocol.Liveness{Interval: time.Second, Timeout: 10 * time.Second})
		if err != nil {
			t.Errorf("hub: %v", err)
			return
		}
		defer tun.Close()
		stream, err := tun.AcceptStream()
		if err != nil {
			t.Errorf("hub: accepting the control stream: %v", err)
			return
		}
		h := &hubSide{conn: protocol.NewConn(stream), tun: tun, msgs: make(chan any, 64)}
		tunnels <- h
		defer close(h.msgs)
		for hello := true; ; hello = false {
			_, body, err := h.conn.Receive()
			if err != nil {
				return
			}
			if hello {
				// As the hub does, so that the agent may send more than a hello.
				tun.HelloRead()
			}
			h.msgs <- body
		}
	}))
	t.Cleanup(srv.Close)
	return srv, tunnels
}

func owned(obj map[string]any) json.RawMessage {
	meta := obj["metadata"].(map[string]any)
	meta["labels"] = map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: agentIdentity}
	raw, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	return raw
}

// TestTheAgentRunsUnderTheChartsRBAC runs the agent as main builds it, bound to the
// chart's roles and nothing else, through enrollment, an apply, an inventory, a prune and
// a credential rotation; then checks what the roles refuse.
func TestTheAgentRunsUnderTheChartsRBAC(t *testing.T) {
	ctx := t.Context()
	admin := planes[0].Client
	installChartRBAC(t)
	gpuNode := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", Labels: map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
		},
	}
	if err := admin.Create(ctx, gpuNode); err != nil {
		t.Fatal(err)
	}

	hub, tunnels := fakeHub(t, "flt-credential-1")
	cfg, _, stderr, code := invoke(t, nil, "--hub-url", strings.Replace(hub.URL, "http://", "ws://", 1), "--allow-insecure-loopback",
		"--identity", agentIdentity, "--namespace", agentNamespace, "--kubeconfig", agentKubeconfig(t), "--heartbeat", "1s")
	if code != 0 {
		t.Fatal(stderr)
	}
	cfg.EnrollmentToken = token
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	a, err := newAgent(ctx, cfg, log, func(string) string { return "" })
	if err != nil {
		t.Fatalf("newAgent: %v", err)
	}
	actx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- a.Run(actx) }()
	defer func() {
		stop()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v, want context.Canceled", err)
		}
	}()

	var h *hubSide
	select {
	case h = <-tunnels:
	case <-time.After(time.Minute):
		t.Fatal("the agent did not dial the hub")
	}
	hello := next[protocol.Hello](t, h)
	if hello.Identity != agentIdentity || !strings.HasPrefix(hello.KubernetesVersion, "v1.") || hello.AgentVersion == "" {
		t.Errorf("hello %+v", hello)
	}
	// Enrollment stored the credential by server-side apply, which created the Secret
	// under a create rule limited by resourceNames.
	var sec corev1.Secret
	key := types.NamespacedName{Namespace: agentNamespace, Name: defaultCredentialSecret}
	if err := admin.Get(ctx, key, &sec); err != nil || string(sec.Data["credential"]) != "flt-credential-1" {
		t.Fatalf("credential Secret after enrollment: %v, data %v", err, sec.Data)
	}

	namespace := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{
		"name": "team-a", "annotations": map[string]string{v1alpha1.ApplyAnnotation: v1alpha1.ApplyIfNotPresent}}}
	flavor := map[string]any{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": map[string]any{"name": "default-flavor"}, "spec": map[string]any{}}
	queue := map[string]any{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": map[string]any{"name": "cluster-queue"},
		"spec": map[string]any{"namespaceSelector": map[string]any{}, "resourceGroups": []any{map[string]any{
			"coveredResources": []string{"nvidia.com/gpu"},
			"flavors":          []any{map[string]any{"name": "default-flavor", "resources": []any{map[string]any{"name": "nvidia.com/gpu", "nominalQuota": "8"}}}},
		}}}}
	local := map[string]any{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": map[string]any{"name": "user-queue", "namespace": "team-a"},
		"spec": map[string]any{"clusterQueue": "cluster-queue"}}

	steps := []struct {
		name    string
		desired protocol.DesiredState
		want    map[string]protocol.Action // kind/name -> action
	}{
		{
			name:    "the first desired state is created",
			desired: protocol.DesiredState{Generation: 1, Hash: "h1", Objects: []json.RawMessage{owned(namespace), owned(flavor), owned(queue), owned(local)}},
			want: map[string]protocol.Action{"Namespace/team-a": protocol.ActionCreated, "ResourceFlavor/default-flavor": protocol.ActionCreated,
				"ClusterQueue/cluster-queue": protocol.ActionCreated, "LocalQueue/user-queue": protocol.ActionCreated},
		},
		{
			name:    "what the hub no longer wants is pruned",
			desired: protocol.DesiredState{Generation: 2, Hash: "h2", Objects: []json.RawMessage{owned(namespace), owned(flavor), owned(queue)}},
			want: map[string]protocol.Action{"Namespace/team-a": protocol.ActionSkipped, "ResourceFlavor/default-flavor": protocol.ActionUnchanged,
				"ClusterQueue/cluster-queue": protocol.ActionUnchanged, "LocalQueue/user-queue": protocol.ActionPruned},
		},
	}
	for _, s := range steps {
		if err := h.conn.Send(protocol.TypeDesired, &s.desired); err != nil {
			t.Fatal(err)
		}
		// The agent reports the inventory first, then what it applied: listing the nodes
		// is allowed.
		inv := next[protocol.Inventory](t, h)
		if len(inv.Nodes) != 1 || inv.Nodes[0].Name != gpuNode.Name || inv.Nodes[0].Capacity != 8 {
			t.Errorf("%s: inventory %+v", s.name, inv)
		}
		applied := next[protocol.Applied](t, h)
		got := map[string]protocol.Action{}
		for _, r := range applied.Results {
			got[r.Kind+"/"+r.Name] = r.Action
			if r.Message != "" && r.Action != protocol.ActionSkipped {
				t.Errorf("%s: %s %s/%s: %s", s.name, r.Action, r.Kind, r.Name, r.Message)
			}
		}
		if !applied.Complete() || len(got) != len(s.want) {
			t.Errorf("%s: applied %+v", s.name, applied)
		}
		for k, want := range s.want {
			if got[k] != want {
				t.Errorf("%s: %s %s, want %s", s.name, k, got[k], want)
			}
		}
	}

	// A worker whose team runs Kueue: the agent reads the version of its controller's
	// Deployment, and of JobSet's, which is not there.
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}}); err != nil {
		t.Fatal(err)
	}
	teams := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kueue-system", Name: "kueue-controller-manager"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kueue"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "kueue"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.k8s.io/kueue/kueue:v0.17.0"}}}}}}
	if err := admin.Create(ctx, teams); err != nil {
		t.Fatal(err)
	}
	unmanaged := &components.Spec{Kueue: components.Release{Version: "v0.17.0"}, JobSet: components.Release{Version: "v0.11.1"}}
	if err := h.conn.Send(protocol.TypeDesired, &protocol.DesiredState{Generation: 3, Hash: "h3", Objects: []json.RawMessage{owned(namespace), owned(flavor), owned(queue)}, Components: unmanaged}); err != nil {
		t.Fatal(err)
	}
	next[protocol.Inventory](t, h)
	applied := next[protocol.Applied](t, h)
	for _, c := range applied.Components {
		switch {
		case c.Component == components.Kueue && c.Running != "v0.17.0",
			c.Component == components.JobSet && !strings.Contains(c.Message, "not found"),
			strings.Contains(c.Message, "forbidden"):
			t.Errorf("a team's own %s: %+v", c.Component, c)
		}
	}
	if len(applied.Components) != 2 || !applied.Complete() {
		t.Errorf("unmanaged components: applied %+v", applied)
	}

	// A rotation patches the Secret.
	if err := h.conn.Send(protocol.TypeRotateCredential, &protocol.RotateCredential{Credential: "flt-credential-2"}); err != nil {
		t.Fatal(err)
	}
	next[protocol.CredentialStored](t, h)
	if err := admin.Get(ctx, key, &sec); err != nil || string(sec.Data["credential"]) != "flt-credential-2" {
		t.Fatalf("credential Secret after rotation: %v, data %v", err, sec.Data)
	}

	// What the roles refuse.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "someone-elses"}, StringData: map[string]string{"k": "v"}}
	if err := admin.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	restCfg := rest.CopyConfig(planes[0].Config)
	restCfg.Impersonate = rest.ImpersonationConfig{UserName: agentUser}
	as, err := client.New(restCfg, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	refused := []struct {
		name string
		call func() error
	}{
		{"a POST of another Secret", func() error {
			return as.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "another"}})
		}},
		{"a POST of the credential Secret's own name", func() error {
			return as.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: defaultCredentialSecret}})
		}},
		{"a server-side apply creating another Secret", func() error {
			return as.Apply(ctx, corev1ac.Secret("another", agentNamespace), client.FieldOwner("flotilla-agent"))
		}},
		{"reading another Secret", func() error { return as.Get(ctx, client.ObjectKeyFromObject(other), &corev1.Secret{}) }},
		{"listing Secrets", func() error { return as.List(ctx, &corev1.SecretList{}, client.InNamespace(agentNamespace)) }},
		{"deleting the credential Secret", func() error { return as.Delete(ctx, &sec) }},
		{"listing namespaces", func() error { return as.List(ctx, &corev1.NamespaceList{}) }},
		{"deleting a namespace", func() error {
			return as.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}})
		}},
		{"reading a node", func() error { return as.Get(ctx, client.ObjectKeyFromObject(gpuNode), &corev1.Node{}) }},
		{"reading pods", func() error { return as.List(ctx, &corev1.PodList{}) }},
	}
	for _, r := range refused {
		if err := r.call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", r.name, err)
		}
	}

	// The readiness probes of Kueue's and JobSet's webhooks: dry-run creates, allowed.
	probeJobSet := func(namespace string) error {
		return as.Create(ctx, &jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "probe"}, Spec: jobset.JobSetSpec{
			ReplicatedJobs: []jobset.ReplicatedJob{{Name: "w", Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "w", Image: "w"}}}}}}}}}}, client.DryRunAll)
	}
	if err := as.Create(ctx, &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, client.DryRunAll); err != nil {
		t.Errorf("the Kueue readiness probe: %v", err)
	}
	if err := probeJobSet(agentNamespace); err != nil {
		t.Errorf("the JobSet readiness probe: %v", err)
	}
	for name, call := range map[string]func() error{
		"a JobSet in another namespace": func() error { return probeJobSet("team-a") },
		"reading another Deployment": func() error {
			return as.Get(ctx, client.ObjectKey{Namespace: "kueue-system", Name: "other"}, &appsv1.Deployment{})
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", name, err)
		}
	}
}
