package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/helmtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// componentsUser is the identity the chart creates for the agent's installer.
const componentsUser = "system:serviceaccount:" + agentNamespace + ":flotilla-components"

// chartObjects are the objects the chart renders, by template (components.yaml, ...).
type chartObjects map[string][]*unstructured.Unstructured

// renderChartWithHelm renders the chart as `helm install flotilla-agent --namespace
// flotilla-system` would, with the handover values and set on top, its schema checked.
// With cfg, the chart's lookups read that API server; without, they find nothing, as
// in `helm template`.
func renderChartWithHelm(t *testing.T, cfg *rest.Config, set map[string]any) chartObjects {
	t.Helper()
	vals := handoverValues()
	for k, v := range set {
		vals[k] = v
	}
	out := chartObjects{}
	for _, o := range helmtest.MustRender(t, chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: agentNamespace, Values: vals, Config: cfg}) {
		out[path.Base(o.Template)] = append(out[path.Base(o.Template)], o.Unstructured)
	}
	return out
}

func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// documentedRBAC is what the installer documents as its needs (its RBAC.md).
func documentedRBAC(t *testing.T) installer.RBAC {
	t.Helper()
	doc, err := installer.DocumentedRBAC()
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// The installer's RBAC.md is the one source of the installer's rules: the chart must grant
// exactly those to flotilla-components, bind nothing else to it, and let the agent
// impersonate that account and no other.
func TestChartComponentsRolesAreExactlyTheInstallersDocument(t *testing.T) {
	objs := renderChartWithHelm(t, nil, nil)["components.yaml"]
	doc := documentedRBAC(t)
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "flotilla-components", Namespace: agentNamespace}}

	accounts := ofKind(objs, "ServiceAccount")
	if len(accounts) != 1 {
		t.Fatalf("components.yaml has %d ServiceAccounts, want flotilla-components alone", len(accounts))
	}
	if sa := helmtest.Typed[corev1.ServiceAccount](t, accounts[0]); sa.Name != "flotilla-components" || sa.Namespace != agentNamespace ||
		sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("the installer's ServiceAccount is %s/%s, automount %v; want %s/flotilla-components, never mounted", sa.Namespace, sa.Name, sa.AutomountServiceAccountToken, agentNamespace)
	}

	// The installer's roles, each bound to it alone: those that name what it writes, and
	// those that hold what the charts' roles grant. Keyed by kind, namespace and name.
	documented := map[string][]rbacv1.PolicyRule{
		"ClusterRole//flotilla-agent-components":             doc.ClusterRole.Rules,
		"ClusterRole//flotilla-agent-components-controllers": doc.Controllers.Rules,
	}
	for _, r := range doc.Roles {
		documented["Role/"+r.Namespace+"/flotilla-agent-components"] = r.Rules
	}
	for _, r := range doc.ControllersRoles {
		documented["Role/"+r.Namespace+"/flotilla-agent-components-controllers"] = r.Rules
	}
	rendered := map[string][]rbacv1.PolicyRule{}
	for _, u := range ofKind(objs, "ClusterRole") {
		rendered["ClusterRole//"+u.GetName()] = helmtest.Typed[rbacv1.ClusterRole](t, u).Rules
	}
	for _, u := range ofKind(objs, "Role") {
		rendered["Role/"+u.GetNamespace()+"/"+u.GetName()] = helmtest.Typed[rbacv1.Role](t, u).Rules
	}
	bound := map[string][]rbacv1.Subject{}
	for _, u := range ofKind(objs, "ClusterRoleBinding") {
		b := helmtest.Typed[rbacv1.ClusterRoleBinding](t, u)
		if b.Name != b.RoleRef.Name {
			t.Errorf("ClusterRoleBinding %s binds %s %s", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		bound[b.RoleRef.Kind+"//"+b.RoleRef.Name] = b.Subjects
	}
	for _, u := range ofKind(objs, "RoleBinding") {
		b := helmtest.Typed[rbacv1.RoleBinding](t, u)
		if b.Name != b.RoleRef.Name {
			t.Errorf("RoleBinding %s/%s binds %s %s", b.Namespace, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		bound[b.RoleRef.Kind+"/"+b.Namespace+"/"+b.RoleRef.Name] = b.Subjects
	}
	for key, want := range documented {
		got, ok := rendered[key]
		if !ok {
			t.Errorf("the chart has no %s; RBAC.md documents it", key)
			continue
		}
		if g, w := grants(got), grants(want); !slices.Equal(g, w) {
			t.Errorf("the chart's %s grants\n%v\nRBAC.md documents\n%v", key, g, w)
		}
		if !slices.Equal(bound[key], subject) {
			t.Errorf("the chart's %s is bound to %+v, not to the installer alone", key, bound[key])
		}
		delete(rendered, key)
		delete(bound, key)
	}
	impersonateKey := "Role/" + agentNamespace + "/flotilla-agent-impersonate-components"
	impersonate, binding := rendered[impersonateKey], bound[impersonateKey]
	delete(rendered, impersonateKey)
	delete(bound, impersonateKey)
	if len(rendered) > 0 || len(bound) > 0 {
		t.Errorf("the chart has roles or bindings RBAC.md does not document: %v %v", slices.Sorted(maps.Keys(rendered)), slices.Sorted(maps.Keys(bound)))
	}
	if impersonate == nil || binding == nil {
		t.Fatalf("no impersonation Role and binding in %s", agentNamespace)
	}
	if got, want := grants(impersonate), []grant{{Group: "", Resource: "serviceaccounts", Verb: "impersonate", Name: "flotilla-components"}}; !slices.Equal(got, want) {
		t.Errorf("the impersonation Role grants %v, want %v", got, want)
	}
	if !slices.Equal(binding, []rbacv1.Subject{{Kind: "ServiceAccount", Name: "flotilla-agent", Namespace: agentNamespace}}) {
		t.Errorf("the impersonation RoleBinding binds it to %+v", binding)
	}

	// The release namespaces, when nothing else made them, and kept when the agent goes.
	var namespaces []string
	for _, u := range ofKind(objs, "Namespace") {
		namespaces = append(namespaces, u.GetName())
		if u.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("Namespace %s is not kept when the agent is uninstalled: Kueue or JobSet runs there", u.GetName())
		}
	}
	slices.Sort(namespaces)
	if want := []string{components.Namespace(components.JobSet), components.Namespace(components.Kueue)}; !slices.Equal(namespaces, want) {
		t.Errorf("components.yaml makes namespaces %v, want %v", namespaces, want)
	}
}

// components.install tells the agent whether it may install Kueue and JobSet and, when it
// may, as whom; false renders none of the installer's identity, roles or namespaces.
func TestChartComponentsInstallDecidesTheInstallersIdentity(t *testing.T) {
	tests := []struct {
		name        string
		set         map[string]any
		wantInstall bool
		wantAccount string
		wantObjects int
	}{
		{name: "by default the agent installs them as flotilla-components", wantInstall: true, wantAccount: "flotilla-components", wantObjects: 21},
		{name: "components.install false grants nothing to install them", set: map[string]any{"components": map[string]any{"install": false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rendered := renderChartWithHelm(t, nil, tt.set)
			if got := len(rendered["components.yaml"]); got != tt.wantObjects {
				t.Errorf("components.yaml renders %d objects, want %d", got, tt.wantObjects)
			}
			if !tt.wantInstall {
				for file, objs := range rendered {
					for _, u := range objs {
						text, _ := u.MarshalJSON()
						if strings.Contains(string(text), "flotilla-components") || strings.Contains(string(text), "kueue-system") || strings.Contains(string(text), "jobset-system") {
							t.Errorf("%s renders %s %s, which is the installer's", file, u.GetKind(), u.GetName())
						}
					}
				}
			}
			cms := rendered["configmap.yaml"]
			if len(cms) != 1 {
				t.Fatalf("configmap.yaml renders %d objects", len(cms))
			}
			cm := helmtest.Typed[corev1.ConfigMap](t, cms[0])
			cfg, _, stderr, code := invoke(t, nil, "--values", writeFile(t, t.TempDir(), "values.yaml", cm.Data["values.yaml"]))
			if code != 0 {
				t.Fatalf("the agent refuses the ConfigMap's settings:\n%s\n%s", cm.Data["values.yaml"], stderr)
			}
			if cfg.InstallComponents != tt.wantInstall || cfg.ComponentsServiceAccount != tt.wantAccount {
				t.Errorf("the agent reads components.install %v as %q, want %v as %q", cfg.InstallComponents, cfg.ComponentsServiceAccount, tt.wantInstall, tt.wantAccount)
			}
		})
	}
}

// The installer runs beside the agent in its container, so the memory limit is sized for
// both, and the agent's soft limit is its own, not the container's.
func TestChartMemoryFitsTheAgentAndItsInstaller(t *testing.T) {
	deps := renderChartWithHelm(t, nil, nil)["deployment.yaml"]
	if len(deps) != 1 {
		t.Fatalf("deployment.yaml renders %d objects", len(deps))
	}
	c := helmtest.Typed[appsv1.Deployment](t, deps[0]).Spec.Template.Spec.Containers[0]
	limit := c.Resources.Limits[corev1.ResourceMemory]
	// The installer's measured peak during a fresh install, beside the idle agent.
	if need := resource.MustParse("212Mi"); limit.Cmp(need) < 0 {
		t.Errorf("the memory limit is %s; the installer (about 175Mi at its peak) and the agent (about 37Mi idle) need %s", limit.String(), need.String())
	}
	var memlimit string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			if e.ValueFrom != nil {
				t.Errorf("GOMEMLIMIT comes from %+v, want a fixed value", e.ValueFrom)
			}
			memlimit = e.Value
		}
	}
	if memlimit != "64MiB" {
		t.Errorf("GOMEMLIMIT is %q, want the agent's own 64MiB", memlimit)
	}
}

// call is one request of the installer's, as the RBAC authorizer sees it.
type call struct{ group, resource, namespace, name, verb string }

// recorder keeps the installer's requests, to show that each rule it was granted is used.
type recorder struct {
	mu        sync.Mutex
	calls     map[call]bool
	forbidden []string
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (r *recorder) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil {
			r.record(req, resp.StatusCode)
		}
		return resp, err
	})
}

// record maps a request to the attributes RBAC authorizes it by: /api/v1/... and
// /apis/<group>/<version>/..., optionally namespaced, with the method as the verb. An
// apply (PATCH) that creates its object is authorized as create too. Discovery is left
// out: every user may read it. A refused request is kept apart: it used no rule.
func (r *recorder) record(req *http.Request, status int) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var c call
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		c.group, parts = parts[1], parts[3:]
	default:
		return
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		c.namespace, parts = parts[1], parts[2:]
	}
	if len(parts) == 0 {
		return
	}
	c.resource = parts[0]
	if len(parts) > 1 {
		c.name = parts[1]
	}
	if len(parts) > 2 {
		c.resource += "/" + parts[2]
	}
	var verbs []string
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true":
			verbs = []string{"watch"}
		case c.name == "":
			verbs = []string{"list"}
		default:
			verbs = []string{"get"}
		}
	case http.MethodPost:
		verbs = []string{"create"}
	case http.MethodPut:
		verbs = []string{"update"}
	case http.MethodPatch:
		verbs = []string{"patch"}
		if status == http.StatusCreated {
			verbs = append(verbs, "create")
		}
	case http.MethodDelete:
		verbs = []string{"delete"}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if status == http.StatusForbidden {
		r.forbidden = append(r.forbidden, req.Method+" "+req.URL.Path)
		return
	}
	for _, v := range verbs {
		c.verb = v
		r.calls[c] = true
	}
}

// unused lists the grants of rules (in namespace, "" for a ClusterRole's) that no
// recorded call needed. escalate and bind are not requests of their own: the API server
// checks them when a role or binding is written, and the test removes them to show that.
func (r *recorder) unused(rules []rbacv1.PolicyRule, namespace string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, g := range grants(rules) {
		if g.Verb == "escalate" || g.Verb == "bind" {
			continue
		}
		used := false
		for c := range r.calls {
			if c.group == g.Group && c.resource == g.Resource && c.verb == g.Verb && c.namespace == namespace && (g.Name == "*" || g.Name == c.name) {
				used = true
				break
			}
		}
		if !used {
			out = append(out, fmt.Sprintf("%s %s %s/%s", g.Verb, g.Resource, namespace, g.Name))
		}
	}
	return out
}

// startWorkerWithoutComponents starts a control plane of its own for the test: a worker
// without Kueue's and JobSet's CRDs, which this package's shared plane has for the
// agent's other tests.
func startWorkerWithoutComponents(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	dir := t.TempDir()
	planes, err := controlplane.Start(t.Context(), 1, controlplane.Options{WithoutComponentCRDs: true, TempDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := controlplane.StopAll(planes); err != nil {
			t.Error(err)
		}
	})
	return planes[0]
}

// createAsHelm creates objs on plane as `helm install flotilla-agent` would: with Helm's
// marks of the release that owns them.
func createAsHelm(t *testing.T, plane *controlplane.ControlPlane, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, u := range objs {
		u = u.DeepCopy()
		anno := u.GetAnnotations()
		if anno == nil {
			anno = map[string]string{}
		}
		anno["meta.helm.sh/release-name"], anno["meta.helm.sh/release-namespace"] = "flotilla-agent", agentNamespace
		u.SetAnnotations(anno)
		if err := plane.Client.Create(t.Context(), u); err != nil {
			t.Fatalf("creating %s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
}

// waitAuthorized waits until the RBAC authorizer, which learns of roles through its
// informers, answers allowed for user and attrs.
func waitAuthorized(t *testing.T, plane *controlplane.ControlPlane, user string, attrs authorizationv1.ResourceAttributes, allowed bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
		if err := plane.Client.Create(ctx, review); err != nil {
			return false, err
		}
		return review.Status.Allowed == allowed, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to be allowed=%v %+v: %v", user, allowed, attrs, err)
	}
}

// installerAsTheAgentMakesIt is the installer with the identity the agent hands it: the
// agent's ServiceAccount token, impersonating the ServiceAccount its settings (the
// chart's ConfigMap) name, through the kubeconfig the agent writes for it. It runs in
// this process rather than as the flotilla-components binary.
func installerAsTheAgentMakesIt(t *testing.T, plane *controlplane.ControlPlane, settings string, rec *recorder) *installer.Installer {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "flotilla-agent"}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}
	if err := plane.Client.SubResource("token").Create(t.Context(), sa, tr); err != nil {
		t.Fatal(err)
	}
	asAgent := rest.AnonymousClientConfig(plane.Config)
	asAgent.BearerToken = tr.Status.Token

	// newInstaller only checks that the binary exists: this test binary stands in.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, stderr, code := invoke(t, nil, "--values", writeFile(t, t.TempDir(), "values.yaml", settings), "--namespace", agentNamespace, "--components-binary", self)
	if code != 0 {
		t.Fatal(stderr)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	inst, why, err := newInstaller(cfg, asAgent, log)
	if err != nil || why != "" {
		t.Fatalf("newInstaller: %v %s", err, why)
	}
	run, ok := inst.(*components.Installer)
	if !ok {
		t.Fatalf("newInstaller made a %T", inst)
	}
	icfg, err := clientcmd.RESTConfigFromKubeConfig(run.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	if icfg.Impersonate.UserName != componentsUser {
		t.Fatalf("the agent's installer acts as %q, want %q", icfg.Impersonate.UserName, componentsUser)
	}
	icfg.Wrap(rec.wrap)
	return &installer.Installer{Config: icfg, Log: log, Images: run.Images}
}

func componentsSpec() components.Spec {
	latest := func(c components.Component) string {
		vs := components.Installable(c)
		return vs[len(vs)-1]
	}
	return components.Spec{
		Managed:    true,
		Kueue:      components.Release{Version: latest(components.Kueue)},
		JobSet:     components.Release{Version: latest(components.JobSet)},
		Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset"},
	}
}

func wantComponentActions(t *testing.T, rep components.Report, want components.Action) {
	t.Helper()
	if len(rep.Components) != len(components.All()) {
		t.Fatalf("the report has %+v", rep.Components)
	}
	for _, st := range rep.Components {
		if st.Action != want {
			t.Errorf("%s: %s (%s), want %s", st.Component, st.Action, st.Message, want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// The agent's installer, given exactly the chart's RBAC and the identity the agent gives
// it, installs Kueue and JobSet on a fresh worker, finds them unchanged, upgrades them
// to a registry mirror, uninstalls them and adopts CRDs left by hand, using every rule it
// was granted, and writing the charts' roles and bindings with escalate on the two
// aggregated roles only; without escalate there, bind on Kubernetes' own Role, the
// controllers' permissions it holds, or Helm's records, it is refused, and says so.
func TestTheInstallerRunsUnderExactlyTheChartsRBAC(t *testing.T) {
	plane := startWorkerWithoutComponents(t)
	ctx := t.Context()
	admin := plane.Client
	jobsetNS, kueueNS := components.Namespace(components.JobSet), components.Namespace(components.Kueue)

	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	// jobset-system exists already, made by someone else: the chart leaves it alone and
	// puts its Role into it.
	for _, ns := range []string{agentNamespace, jobsetNS} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// The worker's administrator allows the mirror the upgrade below pulls from, and pins
	// a JobSet release the fleet does not run.
	withMirror := map[string]any{"components": map[string]any{
		"allowedRegistries": []any{"registry.k8s.io", "mirror.example.com"},
		"requiredDigests":   map[string]any{pinnedJobSet: pinnedDigest},
	}}
	var rendered chartObjects
	step("the chart makes the release namespaces that do not exist, and keeps making its own", func(t *testing.T) {
		rendered = renderChartWithHelm(t, plane.Config, withMirror)
		namespaces := func(objs chartObjects) []string {
			var out []string
			for _, u := range ofKind(objs["components.yaml"], "Namespace") {
				out = append(out, u.GetName())
			}
			return out
		}
		if got := namespaces(rendered); !slices.Equal(got, []string{kueueNS}) {
			t.Fatalf("with %s there already, the chart makes namespaces %v, want %s alone", jobsetNS, got, kueueNS)
		}
		var objs []*unstructured.Unstructured
		objs = append(objs, rendered["serviceaccount.yaml"]...)
		objs = append(objs, rendered["components.yaml"]...)
		createAsHelm(t, plane, objs)
		// An upgrade of the agent's release still renders the namespace it made.
		if got := namespaces(renderChartWithHelm(t, plane.Config, withMirror)); !slices.Equal(got, []string{kueueNS}) {
			t.Errorf("after the install, the chart makes namespaces %v, want %s, its own, alone", got, kueueNS)
		}
	})
	for _, g := range []struct {
		user  string
		attrs authorizationv1.ResourceAttributes
	}{
		{agentUser, authorizationv1.ResourceAttributes{Resource: "serviceaccounts", Verb: "impersonate", Namespace: agentNamespace, Name: "flotilla-components"}},
		{componentsUser, authorizationv1.ResourceAttributes{Resource: "namespaces", Verb: "patch", Name: kueueNS}},
		{componentsUser, authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "list", Namespace: kueueNS}},
		{componentsUser, authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "list", Namespace: jobsetNS}},
		{componentsUser, authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "rolebindings", Verb: "create", Namespace: "kube-system", Name: "kueue-visibility-server-auth-reader"}},
		{componentsUser, authorizationv1.ResourceAttributes{Resource: "pods", Verb: "delete", Namespace: "default"}},
		{componentsUser, authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "create", Namespace: jobsetNS}},
	} {
		waitAuthorized(t, plane, g.user, g.attrs, true)
	}
	// The admission policy is compiled in the background: a request outside it, which
	// RBAC allows (JobSet's controller may create Services anywhere), is refused once it
	// applies.
	asInstaller := installerClient(t, plane)
	poll.Until(t, "the installer's admission policy applies", func() (bool, string) {
		err := asInstaller.Create(ctx, outsideService(), client.DryRunAll)
		return isRefusedByPolicy(err), fmt.Sprint(err)
	})

	rec := &recorder{calls: map[call]bool{}}
	inst := installerAsTheAgentMakesIt(t, plane, helmtest.Typed[corev1.ConfigMap](t, rendered["configmap.yaml"][0]).Data["values.yaml"], rec)
	spec := componentsSpec()

	step("a fresh worker gets both components", func(t *testing.T) {
		began := time.Now()
		rep, err := inst.Apply(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("fresh install under the chart's RBAC took %v", time.Since(began).Round(time.Millisecond))
		wantComponentActions(t, rep, components.ActionInstalled)
	})
	step("applying them again changes nothing", func(t *testing.T) {
		rep, err := inst.Apply(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		wantComponentActions(t, rep, components.ActionUnchanged)
	})
	step("a registry mirror upgrades both in place", func(t *testing.T) {
		// As the worker's administrator allows it (components.allowedRegistries).
		inst.Images.AllowedRegistries = append(inst.Images.Registries(), "mirror.example.com")
		spec.Registry = "mirror.example.com"
		rep, err := inst.Apply(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		wantComponentActions(t, rep, components.ActionUpgraded)
		for _, c := range components.All() {
			var dep appsv1.Deployment
			name := map[components.Component]string{components.Kueue: "kueue-controller-manager", components.JobSet: "jobset-controller"}[c]
			if err := admin.Get(ctx, client.ObjectKey{Namespace: components.Namespace(c), Name: name}, &dep); err != nil {
				t.Fatal(err)
			}
			if got, want := dep.Spec.Template.Spec.Containers[0].Image, spec.Image(c); got != want {
				t.Errorf("%s runs %s, want %s", name, got, want)
			}
		}
	})
	step("uninstalling removes both releases and keeps the CRDs", func(t *testing.T) {
		rep, err := inst.Uninstall(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Components) != 0 || !slices.Contains(rep.Removed, "Helm release "+kueueNS+"/kueue") || !slices.Contains(rep.Removed, "Helm release "+jobsetNS+"/jobset") {
			t.Fatalf("uninstall reports %+v", rep)
		}
		var dep appsv1.Deployment
		if err := admin.Get(ctx, client.ObjectKey{Namespace: kueueNS, Name: "kueue-controller-manager"}, &dep); !apierrors.IsNotFound(err) {
			t.Errorf("Kueue's controller after the uninstall: %v", err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := admin.Get(ctx, client.ObjectKey{Name: "workloads.kueue.x-k8s.io"}, &crd); err != nil {
			t.Errorf("the Workload CRD after the uninstall: %v", err)
		}
		if len(rec.forbidden) > 0 {
			t.Errorf("requests refused: %v", rec.forbidden)
		}
	})

	// Each case takes rules away from one of the live roles, runs a fresh install, and
	// puts them back. JobSet goes first; when it fails, Kueue is not attempted. (An
	// upgrade that leaves a role as it is would not show escalate, bind or a held rule
	// missing: the API server checks them only when a role or binding is created or
	// changes.)
	// The chart names the installer's roles after its release.
	const clusterRoleName, controllersName = "flotilla-agent-components", "flotilla-agent-components-controllers"
	cases := []struct {
		name string
		// role is the installer's role that loses the rules: namespace ("" for a
		// ClusterRole) and name.
		namespace, role string
		without         func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule
		// lost is what the installer may no longer do once the rules are gone.
		lost authorizationv1.ResourceAttributes
		// fails is the component that fails; want are substrings of its failure.
		fails components.Component
		want  []string
	}{
		{
			name:    "without escalate Kueue's aggregated ClusterRoles cannot be written",
			role:    clusterRoleName,
			without: withoutVerb("clusterroles", "escalate"),
			lost:    authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "clusterroles", Verb: "escalate", Name: "kueue-batch-admin-role"},
			fails:   components.Kueue,
			want:    []string{`clusterroles.rbac.authorization.k8s.io "kueue-batch-`, "must have cluster-admin privileges to use the aggregationRule"},
		},
		{
			name: "without holding what JobSet's ClusterRole grants it cannot be written",
			role: controllersName,
			without: func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
				return slices.DeleteFunc(rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "pods") })
			},
			lost:  authorizationv1.ResourceAttributes{Resource: "pods", Verb: "delete", Namespace: "default"},
			fails: components.JobSet,
			want:  []string{`clusterroles.rbac.authorization.k8s.io "jobset-controller" is forbidden`, "attempting to grant RBAC permissions not currently held"},
		},
		{
			name:      "without holding in its namespace what JobSet's Role grants it cannot be written",
			namespace: jobsetNS,
			role:      controllersName,
			without: func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
				return slices.DeleteFunc(rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "leases") })
			},
			lost:  authorizationv1.ResourceAttributes{Group: "coordination.k8s.io", Resource: "leases", Verb: "create", Namespace: jobsetNS},
			fails: components.JobSet,
			want:  []string{`roles.rbac.authorization.k8s.io "jobset-controller" is forbidden`, "attempting to grant RBAC permissions not currently held"},
		},
		{
			name:      "without bind Kubernetes' authentication reader cannot be bound",
			namespace: "kube-system",
			role:      clusterRoleName,
			without:   withoutVerb("roles", "bind"),
			lost:      authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "roles", Verb: "bind", Namespace: "kube-system", Name: "extension-apiserver-authentication-reader"},
			fails:     components.Kueue,
			want:      []string{`rolebindings.rbac.authorization.k8s.io "kueue-visibility-server-auth-reader" is forbidden`, "attempting to grant RBAC permissions not currently held"},
		},
		{
			name:      "without Helm's records no release is made",
			namespace: jobsetNS,
			role:      clusterRoleName,
			without: func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
				return slices.DeleteFunc(rules, func(r rbacv1.PolicyRule) bool {
					return slices.Contains(r.Resources, "secrets") && len(r.ResourceNames) == 0
				})
			},
			// The Role that holds the controller's rules still lets it read Secrets
			// there, not create them.
			lost:  authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "create", Namespace: jobsetNS},
			fails: components.JobSet,
			want:  []string{`secrets is forbidden`, `cannot create resource "secrets"`, `in the namespace "jobset-system"`},
		},
	}
	for _, tc := range cases {
		step(tc.name, func(t *testing.T) {
			var role client.Object = &rbacv1.ClusterRole{}
			key := client.ObjectKey{Name: tc.role}
			if tc.namespace != "" {
				role, key = &rbacv1.Role{}, client.ObjectKey{Namespace: tc.namespace, Name: tc.role}
			}
			rules := func() *[]rbacv1.PolicyRule {
				if r, ok := role.(*rbacv1.Role); ok {
					return &r.Rules
				}
				return &role.(*rbacv1.ClusterRole).Rules
			}
			if err := admin.Get(ctx, key, role); err != nil {
				t.Fatal(err)
			}
			kept := slices.Clone(*rules())
			*rules() = tc.without(slices.Clone(kept))
			if len(grants(*rules())) == len(grants(kept)) {
				t.Fatalf("the case removes nothing from %s", key)
			}
			if err := admin.Update(ctx, role); err != nil {
				t.Fatal(err)
			}
			waitAuthorized(t, plane, componentsUser, tc.lost, false)
			defer func() {
				if err := admin.Get(ctx, key, role); err != nil {
					t.Fatal(err)
				}
				*rules() = kept
				if err := admin.Update(ctx, role); err != nil {
					t.Fatal(err)
				}
				waitAuthorized(t, plane, componentsUser, tc.lost, true)
				// What the failed install left, a failed release and the objects it got
				// to, goes, so that the next case starts fresh.
				if _, err := inst.Uninstall(ctx, false); err != nil {
					t.Fatal(err)
				}
			}()

			rep, err := inst.Apply(ctx, componentsSpec())
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range rep.Components {
				switch {
				case st.Component == tc.fails:
					if st.Action != components.ActionFailed {
						t.Fatalf("%s: %+v, want it failed", st.Component, st)
					}
					for _, w := range tc.want {
						if !strings.Contains(st.Message, w) {
							t.Errorf("%s's failure does not say %q: %s", st.Component, w, st.Message)
						}
					}
				case tc.fails == components.JobSet:
					if st.Action != components.ActionFailed || !strings.Contains(st.Message, "not attempted") {
						t.Errorf("%s: %+v, want it not attempted", st.Component, st)
					}
				default:
					if st.Action != components.ActionInstalled {
						t.Errorf("%s: %+v, want it installed", st.Component, st)
					}
				}
			}
		})
	}
	rec.mu.Lock()
	rec.forbidden = nil
	rec.mu.Unlock()

	step("CRDs installed by hand are adopted in place", func(t *testing.T) {
		// The CRDs left behind lose every mark of flotilla and Helm: a Kueue and a
		// JobSet whose CRDs someone applied with kubectl.
		var list apiextensionsv1.CustomResourceDefinitionList
		if err := admin.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		uids := map[string]string{}
		unmark := []byte(`{"metadata":{"labels":{"app.kubernetes.io/managed-by":null},"annotations":{"` + installer.InstalledByAnnotation +
			`":null,"meta.helm.sh/release-name":null,"meta.helm.sh/release-namespace":null,"helm.sh/resource-policy":null}}}`)
		for i := range list.Items {
			crd := &list.Items[i]
			if crd.Spec.Group != "kueue.x-k8s.io" && crd.Spec.Group != "jobset.x-k8s.io" {
				continue
			}
			uids[crd.Name] = string(crd.UID)
			if err := admin.Patch(ctx, crd, client.RawPatch(types.MergePatchType, unmark)); err != nil {
				t.Fatal(err)
			}
		}
		if len(uids) != 12 {
			t.Fatalf("%d CRDs after the uninstall, want Kueue's and JobSet's 12", len(uids))
		}
		rep, err := inst.Apply(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		wantComponentActions(t, rep, components.ActionRefused)
		spec.Adopt = true
		rep, err = inst.Apply(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		wantComponentActions(t, rep, components.ActionAdopted)
		if err := admin.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		for _, crd := range list.Items {
			if uid, ok := uids[crd.Name]; ok && uid != string(crd.UID) {
				t.Errorf("CRD %s was replaced", crd.Name)
			}
		}
	})

	// With both components installed, the installer's identity itself asks for what the
	// charts do not render, each a request its RBAC allows: the API server refuses each.
	for _, tc := range outsideTheCharts() {
		step("the API server refuses the installer "+tc.name, func(t *testing.T) {
			err := tc.send(ctx, asInstaller)
			if !isRefusedByPolicy(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the request was answered %v; want it refused by the policy, saying %q", err, tc.want)
			}
		})
	}

	step("every rule the chart grants was used, and nothing was refused", func(t *testing.T) {
		if len(rec.forbidden) > 0 {
			t.Errorf("requests refused: %v", rec.forbidden)
		}
		doc := documentedRBAC(t)
		unused := rec.unused(doc.ClusterRole.Rules, "")
		for _, r := range doc.Roles {
			unused = append(unused, rec.unused(r.Rules, r.Namespace)...)
		}
		if len(unused) > 0 {
			t.Errorf("the installer never needed these grants of RBAC.md:\n%s", strings.Join(unused, "\n"))
		}
	})
}

// withoutVerb removes verb from the rules on resource.
func withoutVerb(resource, verb string) func([]rbacv1.PolicyRule) []rbacv1.PolicyRule {
	return func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
		var out []rbacv1.PolicyRule
		for _, r := range rules {
			if slices.Contains(r.Resources, resource) {
				r.Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == verb })
				if len(r.Verbs) == 0 {
					continue
				}
			}
			out = append(out, r)
		}
		return out
	}
}

// installerClient acts on plane as the installer's identity, impersonated by the
// administrator: what RBAC and the admission policy let flotilla-components do.
func installerClient(t *testing.T, plane *controlplane.ControlPlane) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(plane.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: componentsUser}
	c, err := client.New(cfg, client.Options{Scheme: plane.Client.Scheme(), Mapper: plane.Client.RESTMapper()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// outsideService is a Service the installer's held permissions let it create, and the
// charts never render. (Not a Job: once Kueue is installed, its webhook, which no server
// answers here, would see a Job first.)
func outsideService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "outside-the-charts"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
}

// isRefusedByPolicy says whether err is the chart's admission policy refusing a request.
func isRefusedByPolicy(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'flotilla-agent-components'")
}

// pinnedJobSet is an image, without its registry, for which the test's worker requires
// pinnedDigest (components.requiredDigests), and which the fleet does not run.
const (
	pinnedJobSet = "jobset/jobset:v0.11.0"
	pinnedDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// outsideRequest is a write the installer's RBAC allows and the charts never render, for
// when both components are installed.
type outsideRequest struct {
	name string
	obj  client.Object
	// patch is a JSON patch of obj; none creates obj.
	patch string
	// want is what the admission policy's refusal says.
	want string
}

// send makes the request through c.
func (r outsideRequest) send(ctx context.Context, c client.Client) error {
	if r.patch == "" {
		return c.Create(ctx, r.obj)
	}
	return c.Patch(ctx, r.obj, client.RawPatch(types.JSONPatchType, []byte(r.patch)))
}

// outsideTheCharts are the writes the admission policy refuses the installer: each one
// that RBAC alone would let it make towards cluster-admin, another's workloads or
// another's images.
func outsideTheCharts() []outsideRequest {
	jobsetNS := components.Namespace(components.JobSet)
	return []outsideRequest{
		{
			name:  "a binding of the charts' name to another subject",
			obj:   &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kueue-manager-rolebinding"}},
			patch: `[{"op":"add","path":"/subjects/-","value":{"kind":"ServiceAccount","name":"flotilla-components","namespace":"` + agentNamespace + `"}}]`,
			want:  "binds rbac.authorization.k8s.io/clusterrolebindings//kueue-manager-rolebinding only as the embedded charts render it",
		},
		{
			name:  "a Deployment of the charts' name with an image from another registry",
			obj:   &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: jobsetNS, Name: "jobset-controller"}},
			patch: `[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"ghcr.io/elsewhere/jobset:v0.11.1"}]`,
			want:  "runs images only from the registries this worker allows (components.allowedRegistries: registry.k8s.io, mirror.example.com), not ghcr.io/elsewhere/jobset:v0.11.1",
		},
		{
			name:  "a Deployment of the charts' name with an image without the digest the worker requires",
			obj:   &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: jobsetNS, Name: "jobset-controller"}},
			patch: `[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"mirror.example.com/` + pinnedJobSet + `"}]`,
			want:  "runs images only with the digests this worker requires (components.requiredDigests), not mirror.example.com/" + pinnedJobSet,
		},
		{
			name:  "a ClusterRole of the charts' name granting more than they render, though the installer holds it",
			obj:   &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kueue-manager-role"}},
			patch: `[{"op":"add","path":"/rules/-","value":{"apiGroups":[""],"resources":["persistentvolumeclaims"],"verbs":["create"]}}]`,
			want:  "writes rbac.authorization.k8s.io/clusterroles//kueue-manager-role only with the rules the embedded charts render; it would grant: apiGroups= resources=persistentvolumeclaims",
		},
		{
			name:  "an aggregated ClusterRole gathering Kubernetes' own roles, cluster-admin's among them",
			obj:   &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kueue-batch-admin-role"}},
			patch: `[{"op":"replace","path":"/aggregationRule/clusterRoleSelectors","value":[{"matchLabels":{"kubernetes.io/bootstrapping":"rbac-defaults"}}]}]`,
			want:  "writes the aggregated rbac.authorization.k8s.io/clusterroles//kueue-batch-admin-role only with the aggregationRule the embedded charts render",
		},
		{
			name:  "a label that aggregates a chart's ClusterRole into Kubernetes' admin role",
			obj:   &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "kueue-manager-role"}},
			patch: `[{"op":"add","path":"/metadata/labels/rbac.authorization.k8s.io~1aggregate-to-admin","value":"true"}]`,
			want:  "gives rbac.authorization.k8s.io/clusterroles//kueue-manager-role only the aggregation labels the embedded charts render",
		},
		{
			name:  "a webhook of the charts' name sent to a server of another's",
			obj:   &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kueue-validating-webhook-configuration"}},
			patch: `[{"op":"replace","path":"/webhooks/0/clientConfig","value":{"url":"https://webhook.example.com/validate"}}]`,
			want:  "points admissionregistration.k8s.io/validatingwebhookconfigurations//kueue-validating-webhook-configuration only at the Services the embedded charts render",
		},
		{
			name: "a Service outside the charts, which the controllers' permissions it holds allow",
			obj:  outsideService(),
			want: "writes only the objects of the Kueue and JobSet charts it embeds, and their Helm release records, not services /services/default/outside-the-charts",
		},
	}
}
