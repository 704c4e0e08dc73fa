package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// The hub's MultiKueue, as the proxy sees it: these tests make the calls Kueue v0.17.0
// makes of a worker (a controller-runtime client.WithWatch, the same verbs and
// selectors), through agent/proxy, against a real API server where the chart's RBAC is
// installed and the proxy authenticates with a token of the agent's own ServiceAccount.

const (
	// origin is the hub's multikueue-origin label value.
	origin = "flotilla-hub"
	// dispatchNamespace is a workload namespace on the worker.
	dispatchNamespace = "dispatch-a"
	// otherNamespace is a namespace of the worker that no scope of these tests names
	// unless it says so: a team's own.
	otherNamespace = "team-own"
)

// serviceAccountToken is a token of the ServiceAccount name in the agent's namespace,
// created when missing.
func serviceAccountToken(t *testing.T, name string) string {
	t.Helper()
	ctx := t.Context()
	admin := planes[0].Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: name}}
	if err := admin.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := admin.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("requesting a token of %s: %v", name, err)
	}
	return tr.Status.Token
}

// agentRESTConfig reaches the plane as the chart's agent ServiceAccount, by its token,
// as the agent in its pod does.
func agentRESTConfig(t *testing.T) *rest.Config {
	t.Helper()
	cfg := rest.AnonymousClientConfig(planes[0].Config)
	cfg.BearerToken = serviceAccountToken(t, "flotilla-agent")
	return cfg
}

// agentTokenKubeconfig writes a kubeconfig of the plane with the agent ServiceAccount's
// token.
func agentTokenKubeconfig(t *testing.T) string {
	t.Helper()
	cfg := agentRESTConfig(t)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["worker"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["worker"] = &clientcmdapi.Context{Cluster: "worker", AuthInfo: "agent"}
	kc.CurrentContext = "worker"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// dispatchProxy installs the chart's RBAC and serves a proxy.Handler, built from the
// agent's credentials as main builds it, on a loopback HTTP server, scoped as a desired
// state of the hub of origin whose workload namespace is dispatchNamespace would scope
// it. It returns the server's URL and the handler's log.
func dispatchProxy(t *testing.T, opts proxy.Options) (string, *logtest.Buffer) {
	t.Helper()
	p := serveDispatchProxy(t, opts)
	p.scope(t, proxy.Scope{Origin: origin, Namespaces: []string{dispatchNamespace}})
	return p.url, p.logs
}

// servedProxy is a proxy.Handler served on loopback, and what it logs.
type servedProxy struct {
	h    *proxy.Handler
	url  string
	logs *logtest.Buffer
}

// serveDispatchProxy is dispatchProxy before any scope: it forwards nothing but
// discovery.
func serveDispatchProxy(t *testing.T, opts proxy.Options) servedProxy {
	t.Helper()
	installChartRBAC(t)
	ensureNamespace(t, dispatchNamespace)
	logs := &logtest.Buffer{}
	if opts.Config == nil {
		opts.Config = agentRESTConfig(t)
	}
	opts.Namespace = agentNamespace
	if opts.ClusterRole == "" {
		opts.ClusterRole = dispatchClusterRole
	}
	opts.Log = slog.New(slog.NewJSONHandler(io.MultiWriter(logs, t.Output()), nil))
	h, err := proxy.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config = proxy.NewServer(h, opts.Log)
	srv.Start()
	t.Cleanup(srv.Close)
	// The next test's proxy starts from no scope: what this one bound goes with it.
	t.Cleanup(func() {
		if _, err := h.SetScope(context.Background(), proxy.Scope{}); err != nil {
			t.Errorf("unbinding the dispatch identity: %v", err)
		}
	})
	return servedProxy{h: h, url: srv.URL, logs: logs}
}

// scope sets the proxy's scope and waits until the API server grants the dispatch
// identity what the agent bound in each of its namespaces, and no longer grants it in
// those it left.
func (p servedProxy) scope(t *testing.T, s proxy.Scope) {
	t.Helper()
	if _, err := p.h.SetScope(t.Context(), s); err != nil {
		t.Fatalf("setting the proxy's scope: %v", err)
	}
	in := p.h.Scope().Namespaces
	for _, ns := range []string{dispatchNamespace, otherNamespace} {
		waitGrant(t, dispatchUser, authorizationv1.ResourceAttributes{Group: "kueue.x-k8s.io", Resource: "workloads", Verb: "create", Namespace: ns}, slices.Contains(in, ns))
	}
}

// waitGrant waits until the API server's authorizer allows user attrs, or refuses it.
func waitGrant(t *testing.T, user string, attrs authorizationv1.ResourceAttributes, allowed bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, poll.Deadline, true, func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
		if err := planes[0].Client.Create(ctx, review); err != nil {
			return false, err
		}
		return review.Status.Allowed == allowed, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to be allowed=%v to %s %s in %s: %v", user, allowed, attrs.Verb, attrs.Resource, attrs.Namespace, err)
	}
}

func ensureNamespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := planes[0].Client.Create(t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// kueueClient is the worker client Kueue's MultiKueue builds from its kubeconfig.
func kueueClient(t *testing.T, cfg *rest.Config) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: planes[0].Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newWorkload(name string, labels map[string]string) *kueue.Workload {
	return &kueue.Workload{
		TypeMeta:   metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "Workload"},
		ObjectMeta: metav1.ObjectMeta{Namespace: dispatchNamespace, Name: name, Labels: labels},
		Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{
			Name:  kueue.DefaultPodSetName,
			Count: 1,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: "registry.example/train:1"}},
			}},
		}}},
	}
}

func newJob(name string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: dispatchNamespace, Name: name, Labels: map[string]string{kueue.MultiKueueOriginLabel: origin}},
		Spec: batchv1.JobSpec{
			Suspend: ptr.To(true),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: "registry.example/train:1"}},
			}},
		},
	}
}

// watchOrigin opens the watch MultiKueue keeps on a worker: cluster-wide, by the origin
// label, with bookmarks.
func watchOrigin(t *testing.T, c client.WithWatch, list client.ObjectList) watch.Interface {
	t.Helper()
	w, err := c.Watch(t.Context(), list, client.MatchingLabels{kueue.MultiKueueOriginLabel: origin},
		&client.ListOptions{Raw: &metav1.ListOptions{AllowWatchBookmarks: true}})
	if err != nil {
		t.Fatalf("watching %T: %v", list, err)
	}
	t.Cleanup(w.Stop)
	return w
}

// nextEvent waits for an event of the named object on w.
func nextEvent(t *testing.T, w watch.Interface, typ watch.EventType, name string) {
	t.Helper()
	timeout := time.NewTimer(poll.Deadline)
	defer timeout.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended before %s %s", typ, name)
			}
			if obj, isObj := ev.Object.(client.Object); isObj && ev.Type == typ && obj.GetName() == name {
				return
			}
		case <-timeout.C:
			t.Fatalf("no %s event of %s within %s", typ, name, poll.Deadline)
		}
	}
}

func TestTheProxyServesMultiKueueUnderTheDispatchIdentity(t *testing.T) {
	ctx := t.Context()
	url, _ := dispatchProxy(t, proxy.Options{})
	cfg := &rest.Config{Host: url}

	// Discovery, as the RESTMapper of Kueue's worker client reads it.
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.ServerVersion(); err != nil {
		t.Errorf("the server version: %v", err)
	}
	if _, err := dc.ServerGroups(); err != nil {
		t.Errorf("the API groups: %v", err)
	}
	if res, err := dc.ServerResourcesForGroupVersion(kueue.GroupVersion.String()); err != nil || len(res.APIResources) == 0 {
		t.Errorf("the resources of %s: %v", kueue.GroupVersion, err)
	}

	c := kueueClient(t, cfg)
	workloads := watchOrigin(t, c, &kueue.WorkloadList{})
	jobs := watchOrigin(t, c, &batchv1.JobList{})
	watchOrigin(t, c, &jobset.JobSetList{})

	// The remote workload, created from the hub's: it arrives on the open watch.
	wl := newWorkload("job-train-1", map[string]string{kueue.MultiKueueOriginLabel: origin})
	wl.Finalizers = []string{kueue.ResourceInUseFinalizerName}
	if err := c.Create(ctx, wl); err != nil {
		t.Fatalf("creating a workload: %v", err)
	}
	nextEvent(t, workloads, watch.Added, wl.Name)

	var got kueue.Workload
	if err := c.Get(ctx, client.ObjectKeyFromObject(wl), &got); err != nil {
		t.Fatalf("reading the workload: %v", err)
	}
	var list kueue.WorkloadList
	if err := c.List(ctx, &list, client.MatchingLabels{kueue.MultiKueueOriginLabel: origin}); err != nil || len(list.Items) == 0 {
		t.Fatalf("listing workloads by origin: %v, %d items", err, len(list.Items))
	}

	// Admission status, by server-side apply as workload.PatchAdmissionStatus writes it.
	status := &kueue.Workload{
		TypeMeta:   metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "Workload"},
		ObjectMeta: metav1.ObjectMeta{Namespace: wl.Namespace, Name: wl.Name},
		Status: kueue.WorkloadStatus{Conditions: []metav1.Condition{{
			Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue, Reason: kueue.WorkloadEvictedOnManagerCluster,
			Message: "Evicted on manager: test", LastTransitionTime: metav1.Now(),
		}}},
	}
	//lint:ignore SA1019 the request Kueue v0.17 makes, whatever client-go now prefers
	if err := c.Status().Patch(ctx, status, client.Apply, client.FieldOwner("kueue-admission"), client.ForceOwnership); err != nil {
		t.Fatalf("applying the workload's status: %v", err)
	}
	nextEvent(t, workloads, watch.Modified, wl.Name)

	// The finalizer removed by update, then the delete.
	if err := c.Get(ctx, client.ObjectKeyFromObject(wl), &got); err != nil {
		t.Fatal(err)
	}
	got.Finalizers = nil
	if err := c.Update(ctx, &got); err != nil {
		t.Fatalf("removing the workload's finalizer: %v", err)
	}
	if err := c.Delete(ctx, &got); err != nil {
		t.Fatalf("deleting the workload: %v", err)
	}
	nextEvent(t, workloads, watch.Deleted, wl.Name)

	// The job: created, read for its status, deleted with background propagation.
	j := newJob("train-1")
	if err := c.Create(ctx, j); err != nil {
		t.Fatalf("creating a job: %v", err)
	}
	nextEvent(t, jobs, watch.Added, j.Name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(j), &batchv1.Job{}); err != nil {
		t.Fatalf("reading the job: %v", err)
	}
	if err := c.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("deleting the job: %v", err)
	}
	nextEvent(t, jobs, watch.Deleted, j.Name)
}

// forbidden decodes a refusal and checks it is the proxy's 403 Status.
func forbidden(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	defer resp.Body.Close()
	var st metav1.Status
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden || json.Unmarshal(body, &st) != nil || st.Reason != metav1.StatusReasonForbidden || st.Kind != "Status" {
		t.Errorf("%s: HTTP %d %s, want the proxy's 403 Status", what, resp.StatusCode, body)
	}
}

func TestTheProxyRefusesWhatMultiKueueDoesNotNeed(t *testing.T) {
	ctx := t.Context()
	url, logs := dispatchProxy(t, proxy.Options{})
	admin := planes[0].Client
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: dispatchNamespace, Name: "registry-credentials"}, StringData: map[string]string{"k": "v"}}
	if err := admin.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	adminToken := clusterAdminToken(t)

	tests := []struct {
		name   string
		method string
		path   string
		header http.Header
	}{
		{name: "a Secret", method: "GET", path: "/api/v1/namespaces/" + dispatchNamespace + "/secrets/registry-credentials"},
		{name: "a Secret with the cluster admin's token", method: "GET", path: "/api/v1/namespaces/" + dispatchNamespace + "/secrets/registry-credentials",
			header: http.Header{"Authorization": {"Bearer " + adminToken}}},
		{name: "a Secret impersonating system:admin", method: "GET", path: "/api/v1/namespaces/" + dispatchNamespace + "/secrets/registry-credentials",
			header: http.Header{"Impersonate-User": {"system:admin"}, "Impersonate-Group": {"system:masters"}}},
		{name: "ConfigMaps", method: "GET", path: "/api/v1/namespaces/" + dispatchNamespace + "/configmaps"},
		{name: "a pod's exec", method: "POST", path: "/api/v1/namespaces/" + dispatchNamespace + "/pods/train-0/exec?command=sh&stdin=true"},
		{name: "nodes", method: "GET", path: "/api/v1/nodes"},
		{name: "a ClusterRoleBinding", method: "POST", path: "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"},
		{name: "the escaped path of a Secret", method: "GET", path: "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + dispatchNamespace + "/workloads/..%2F..%2F..%2F..%2F..%2Fapi%2Fv1%2Fsecrets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctx, tt.method, url+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.header {
				req.Header[k] = v
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			forbidden(t, tt.name, resp)
		})
	}
	// A client sees a typed Forbidden error.
	c := kueueClient(t, &rest.Config{Host: url, BearerToken: adminToken})
	if err := c.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading a Secret through the proxy: %v, want Forbidden", err)
	}
	// Refusals are logged with what was asked and why, and never with a credential.
	log := logs.String()
	for _, want := range []string{`"msg":"refused a proxied request"`, `"path":"/api/v1/nodes"`, `"reason":"list nodes is not in the allowlist"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the proxy's log lacks %s:\n%s", want, log)
		}
	}
	if strings.Contains(log, adminToken) {
		t.Error("the proxy's log holds the caller's token")
	}
}

// clusterAdminToken is the token of a ServiceAccount bound to cluster-admin: what a
// caller of the proxy must never be able to act as.
func clusterAdminToken(t *testing.T) string {
	t.Helper()
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-cluster-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "test-cluster-admin", Namespace: agentNamespace}},
	}
	if err := planes[0].Client.Create(t.Context(), binding); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return serviceAccountToken(t, "test-cluster-admin")
}

// TestCallersCannotChooseTheIdentity makes the API server say who a request through the
// proxy acts as: a ValidatingAdmissionPolicy refuses workloads labelled whoami, with a
// message naming the requester and its groups.
func TestCallersCannotChooseTheIdentity(t *testing.T) {
	ctx := t.Context()
	url, _ := dispatchProxy(t, proxy.Options{})
	admin := planes[0].Client
	adminToken := clusterAdminToken(t)
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "test-whoami"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{kueue.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"workloads"}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression:        "false",
				MessageExpression: `"whoami user=" + request.userInfo.username + " groups=" + request.userInfo.groups.join(",") + " end"`,
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-whoami"},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{ObjectSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"flotilla.test/whoami": "true"}}},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := admin.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	probe := newWorkload("whoami", map[string]string{"flotilla.test/whoami": "true", kueue.MultiKueueOriginLabel: origin})
	body, err := json.Marshal(probe)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "the whoami policy refuses workloads", func() (bool, string) {
		err := admin.Create(ctx, probe.DeepCopy())
		return err != nil && strings.Contains(err.Error(), "whoami user="), fmt.Sprint(err)
	})

	path := "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + dispatchNamespace + "/workloads"
	tests := []struct {
		name   string
		header http.Header
	}{
		{name: "no identity of its own"},
		{name: "the cluster admin's bearer token", header: http.Header{"Authorization": {"Bearer " + adminToken}}},
		// The admin may impersonate any group: forwarded, this would add system:masters.
		{name: "the cluster admin's bearer token with an impersonated group", header: http.Header{
			"Authorization": {"Bearer " + adminToken}, "Impersonate-Group": {"system:masters"}}},
		{name: "impersonating system:admin", header: http.Header{"Impersonate-User": {"system:admin"}}},
		{name: "adding system:masters to the impersonated groups", header: http.Header{"Impersonate-Group": {"system:masters"}}},
		{name: "an impersonated UID and extra", header: http.Header{"Impersonate-Uid": {"0"}, "Impersonate-Extra-Scopes": {"all"}}},
		{name: "front-proxy headers", header: http.Header{"X-Remote-User": {"system:admin"}, "X-Remote-Group": {"system:masters"}}},
		{name: "a proxy authorization", header: http.Header{"Proxy-Authorization": {"Bearer " + adminToken}}},
	}
	const want = "whoami user=" + dispatchUser + " groups=system:serviceaccounts,system:serviceaccounts:" + agentNamespace + ",system:authenticated end"
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctx, "POST", url+path, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tt.header {
				req.Header[k] = v
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			if !strings.Contains(string(got), want) {
				t.Errorf("HTTP %d %s\nwant the API server to see %q", resp.StatusCode, got, want)
			}
		})
	}
}

func TestTheProxyCapsBodiesAndRequestsInFlight(t *testing.T) {
	ctx := t.Context()
	url, _ := dispatchProxy(t, proxy.Options{MaxConcurrent: 2})
	path := url + "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + dispatchNamespace + "/workloads"

	big := newWorkload("too-big", map[string]string{kueue.MultiKueueOriginLabel: origin})
	big.Annotations = map[string]string{"filler": strings.Repeat("x", proxy.DefaultMaxBodyBytes)}
	body, err := json.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		body io.Reader
	}{
		{"a body of declared length", bytes.NewReader(body)},
		{"a chunked body", io.MultiReader(bytes.NewReader(body))}, // no length known in advance
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctx, "POST", path, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			// The API server has a cap of its own: the proxy's answer says it is the
			// proxy's.
			if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(got), `"reason":"RequestEntityTooLarge"`) ||
				!strings.Contains(string(got), "flotilla-agent: the request body is larger than") {
				t.Errorf("HTTP %d %s, want the proxy's 413 with a Status", resp.StatusCode, got)
			}
		})
	}
	if err := planes[0].Client.Get(ctx, client.ObjectKeyFromObject(big), &kueue.Workload{}); !apierrors.IsNotFound(err) {
		t.Errorf("the oversized workload reached the API server: %v", err)
	}

	// Two watches hold both places; a third request waits its turn.
	watches := make([]*http.Response, 2)
	for i := range watches {
		resp, err := http.Get(url + "/apis/kueue.x-k8s.io/v1beta2/workloads?watch=true&labelSelector=" + kueue.MultiKueueOriginLabel + "%3D" + origin)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("watch %d: %v %v", i, err, resp)
		}
		watches[i] = resp
	}
	resp, err := http.Get(url + "/api")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(got), `"reason":"TooManyRequests"`) {
		t.Errorf("a third request with two in flight: HTTP %d, Retry-After %q, %s; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), got)
	}
	// An ended watch gives its place back.
	watches[0].Body.Close()
	defer watches[1].Body.Close()
	poll.Until(t, "a request is served once a watch ended", func() (bool, string) {
		resp, err := http.Get(url + "/api")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// hubDialer opens a stream of kind through the hub's end of the tunnel, as the hub's
// proxy does for each connection.
func hubDialer(tun *protocol.Tunnel, kind protocol.StreamKind) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		st, err := tun.OpenStream()
		if err != nil {
			return nil, err
		}
		if err := protocol.WriteStreamKind(st, kind); err != nil {
			_ = st.Close()
			return nil, err
		}
		return st, nil
	}
}

// startAgentWithHub runs the agent as main builds it, with the agent ServiceAccount's
// token, against a fake hub answering protocol version, and returns the hub's end of
// the tunnel.
func startAgentWithHub(t *testing.T, version int, dispatch bool) *hubSide {
	t.Helper()
	ctx := t.Context()
	installChartRBAC(t)
	ensureNamespace(t, dispatchNamespace)
	// Every run enrolls afresh, and leaves no credential behind for the next test.
	forget := func(ctx context.Context) {
		stored := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: defaultCredentialSecret}}
		if err := planes[0].Client.Delete(ctx, stored); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
	forget(ctx)
	hub, tunnels := fakeHubSpeaking(t, "flt-credential-streams", version)
	cfg, _, stderr, code := invoke(t, nil, "--hub-url", strings.Replace(hub.URL, "http://", "ws://", 1), "--allow-insecure-loopback",
		"--identity", agentIdentity, "--namespace", agentNamespace, "--kubeconfig", agentTokenKubeconfig(t), "--heartbeat", "1s",
		fmt.Sprintf("--dispatch=%v", dispatch), "--dispatch-cluster-role", dispatchClusterRole)
	if code != 0 {
		t.Fatal(stderr)
	}
	cfg.EnrollmentToken = token
	a, err := newAgent(ctx, cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), func(string) string { return "" })
	if err != nil {
		t.Fatalf("newAgent: %v", err)
	}
	actx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- a.Run(actx) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v, want context.Canceled", err)
		}
		forget(context.Background())
	})
	select {
	case h := <-tunnels:
		next[protocol.Hello](t, h)
		return h
	case <-time.After(poll.Deadline):
		t.Fatal("the agent did not dial the hub")
	}
	return nil
}

// TestTheAgentServesProxyStreamsOnceNegotiated drives the agent from the hub's end of
// the tunnel: the hub opens a stream per HTTP connection, starts it with its kind, and
// speaks HTTP/1.1 on it.
func TestTheAgentServesProxyStreamsOnceNegotiated(t *testing.T) {
	tests := []struct {
		name     string
		version  int // the hub's answer; 0 for none, as a hub of version 1 answers
		dispatch bool
		served   bool
	}{
		{name: "a hub of the proxy's version is served", version: protocol.ProxyVersion, dispatch: true, served: true},
		{name: "a hub of version 1 has its streams refused", version: 0, dispatch: true},
		{name: "an agent with dispatch off refuses the streams", version: protocol.ProxyVersion, dispatch: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			h := startAgentWithHub(t, tt.version, tt.dispatch)
			c := &http.Client{Transport: &http.Transport{DialContext: hubDialer(h.tun, protocol.StreamProxy)}}
			byOrigin := "labelSelector=" + kueue.MultiKueueOriginLabel + "%3D" + origin
			if tt.served {
				// The hub's desired state names its origin and the workload namespaces.
				if err := h.conn.Send(protocol.TypeDesired, &protocol.DesiredState{Generation: 1, Hash: "sha256:scope",
					Dispatch: &protocol.Dispatch{Origin: origin, Namespaces: []string{dispatchNamespace}}}); err != nil {
					t.Fatal(err)
				}
				next[protocol.Applied](t, h)
				waitGrant(t, dispatchUser, authorizationv1.ResourceAttributes{Group: "kueue.x-k8s.io", Resource: "workloads", Verb: "create", Namespace: dispatchNamespace}, true)
				t.Cleanup(func() { unbindAll(t) })
			}
			resp, err := c.Get("http://worker/apis/kueue.x-k8s.io/v1beta2/workloads?" + byOrigin)
			if !tt.served {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("a refused stream answered HTTP %d", resp.StatusCode)
				}
				return
			}
			if err != nil {
				t.Fatalf("listing workloads through the tunnel: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("listing workloads through the tunnel: HTTP %d", resp.StatusCode)
			}

			// What the proxy refuses, it refuses through the tunnel too.
			resp, err = c.Get("http://worker/api/v1/namespaces/" + agentNamespace + "/secrets/" + defaultCredentialSecret)
			if err != nil {
				t.Fatal(err)
			}
			forbidden(t, "the agent's credential Secret through the tunnel", resp)

			// A stream of a kind the agent does not serve is closed.
			other := &http.Client{Transport: &http.Transport{DialContext: hubDialer(h.tun, 'X')}}
			if resp, err := other.Get("http://worker/api"); err == nil {
				resp.Body.Close()
				t.Errorf("a stream of an unknown kind answered HTTP %d", resp.StatusCode)
			}

			// Kueue's client through the tunnel, with a watch that the hub stops
			// reading: the API server sends it more than the tunnel's window holds,
			// and every other request still goes through.
			kc := kueueClient(t, &rest.Config{Host: "http://worker", Dial: hubDialer(h.tun, protocol.StreamProxy)})
			stalled, err := c.Get("http://worker/apis/kueue.x-k8s.io/v1beta2/workloads?watch=true&" + byOrigin)
			if err != nil || stalled.StatusCode != http.StatusOK {
				t.Fatalf("opening the watch the hub stops reading: %v %v", err, stalled)
			}
			defer stalled.Body.Close()
			for i := range 8 {
				w := newWorkload(fmt.Sprintf("stalled-%d", i), map[string]string{kueue.MultiKueueOriginLabel: origin, "stalled": "true"})
				w.Annotations = map[string]string{"filler": strings.Repeat("x", 200<<10)}
				if err := kc.Create(ctx, w); err != nil {
					t.Fatalf("creating workload %d through the tunnel: %v", i, err)
				}
			}
			var list kueue.WorkloadList
			if err := kc.List(ctx, &list, client.MatchingLabels{kueue.MultiKueueOriginLabel: origin, "stalled": "true"}); err != nil || len(list.Items) != 8 {
				t.Fatalf("listing beside a stalled watch: %v, %d items", err, len(list.Items))
			}
			if err := kc.DeleteAllOf(ctx, &kueue.Workload{}, client.InNamespace(dispatchNamespace), client.MatchingLabels{kueue.MultiKueueOriginLabel: origin}); !apierrors.IsForbidden(err) {
				t.Errorf("deleting a collection through the tunnel: %v, want Forbidden", err)
			}
			for i := range list.Items {
				if err := kc.Delete(ctx, &list.Items[i]); err != nil {
					t.Errorf("deleting %s beside a stalled watch: %v", list.Items[i].Name, err)
				}
			}
		})
	}
}

// unbindAll deletes the RoleBindings an agent wrote for the dispatch identity, as an
// agent that the hub sends an empty scope does: the next test starts from none.
func unbindAll(t *testing.T) {
	ctx := context.Background()
	var list rbacv1.RoleBindingList
	if err := planes[0].Client.List(ctx, &list, client.MatchingLabels{proxy.BindingLabel: agentNamespace}); err != nil {
		t.Error(err)
		return
	}
	for i := range list.Items {
		if err := planes[0].Client.Delete(ctx, &list.Items[i]); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
}
