package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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

	clusterRoles := ofKind(objs, "ClusterRole")
	if len(clusterRoles) != 1 {
		t.Fatalf("components.yaml has %d ClusterRoles, want 1", len(clusterRoles))
	}
	clusterRole := helmtest.Typed[rbacv1.ClusterRole](t, clusterRoles[0])
	if got, want := grants(clusterRole.Rules), grants(doc.ClusterRole.Rules); !slices.Equal(got, want) {
		t.Errorf("the chart's ClusterRole %s grants\n%v\nRBAC.md documents\n%v", clusterRole.Name, got, want)
	}
	bindings := ofKind(objs, "ClusterRoleBinding")
	if len(bindings) != 1 {
		t.Fatalf("components.yaml has %d ClusterRoleBindings, want 1", len(bindings))
	}
	if b := helmtest.Typed[rbacv1.ClusterRoleBinding](t, bindings[0]); b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != clusterRole.Name || !slices.Equal(b.Subjects, subject) {
		t.Errorf("the ClusterRoleBinding binds %+v to %+v", b.RoleRef, b.Subjects)
	}

	// One Role in each namespace RBAC.md names, bound to the installer, and the agent's
	// impersonation Role in the release's namespace.
	roles := map[string]*rbacv1.Role{}
	for _, u := range ofKind(objs, "Role") {
		r := helmtest.Typed[rbacv1.Role](t, u)
		if _, dup := roles[r.Namespace]; dup {
			t.Errorf("two Roles in namespace %s", r.Namespace)
		}
		roles[r.Namespace] = r
	}
	roleBindings := map[string]*rbacv1.RoleBinding{}
	for _, u := range ofKind(objs, "RoleBinding") {
		b := helmtest.Typed[rbacv1.RoleBinding](t, u)
		roleBindings[b.Namespace] = b
	}
	for _, want := range doc.Roles {
		got, ok := roles[want.Namespace]
		if !ok {
			t.Errorf("the chart has no Role in %s; RBAC.md documents one", want.Namespace)
			continue
		}
		if g, w := grants(got.Rules), grants(want.Rules); !slices.Equal(g, w) {
			t.Errorf("the chart's Role in %s grants\n%v\nRBAC.md documents\n%v", want.Namespace, g, w)
		}
		if b := roleBindings[want.Namespace]; b == nil || b.RoleRef.Kind != "Role" || b.RoleRef.Name != got.Name || !slices.Equal(b.Subjects, subject) {
			t.Errorf("the Role in %s is not bound to the installer alone: %+v", want.Namespace, b)
		}
		delete(roles, want.Namespace)
		delete(roleBindings, want.Namespace)
	}
	impersonate, binding := roles[agentNamespace], roleBindings[agentNamespace]
	delete(roles, agentNamespace)
	delete(roleBindings, agentNamespace)
	if len(roles) > 0 || len(roleBindings) > 0 {
		t.Errorf("the chart has Roles or RoleBindings RBAC.md does not document: %v %v", roles, roleBindings)
	}
	if impersonate == nil || binding == nil {
		t.Fatalf("no impersonation Role and binding in %s", agentNamespace)
	}
	if got, want := grants(impersonate.Rules), []grant{{Group: "", Resource: "serviceaccounts", Verb: "impersonate", Name: "flotilla-components"}}; !slices.Equal(got, want) {
		t.Errorf("the impersonation Role grants %v, want %v", got, want)
	}
	if binding.RoleRef.Name != impersonate.Name || binding.RoleRef.Kind != "Role" ||
		!slices.Equal(binding.Subjects, []rbacv1.Subject{{Kind: "ServiceAccount", Name: "flotilla-agent", Namespace: agentNamespace}}) {
		t.Errorf("the impersonation RoleBinding binds %+v to %+v", binding.RoleRef, binding.Subjects)
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
		{name: "by default the agent installs them as flotilla-components", wantInstall: true, wantAccount: "flotilla-components", wantObjects: 13},
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
	return &installer.Installer{Config: icfg, Log: log}
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
// was granted; without any one of the rules that look most like excess (escalate, bind,
// Helm's records) it is refused, and says so.
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
	var rendered chartObjects
	step("the chart makes the release namespaces that do not exist, and keeps making its own", func(t *testing.T) {
		rendered = renderChartWithHelm(t, plane.Config, nil)
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
		if got := namespaces(renderChartWithHelm(t, plane.Config, nil)); !slices.Equal(got, []string{kueueNS}) {
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
	} {
		waitAuthorized(t, plane, g.user, g.attrs, true)
	}

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

	// Each case takes one rule away from the live roles, runs a fresh install, and puts
	// the rule back. JobSet goes first, and fails; Kueue is not attempted. (An upgrade
	// that leaves a role as it is would not show escalate or bind missing: the API
	// server checks them only when a role or binding is created or changes.)
	clusterRoleName := helmtest.Typed[rbacv1.ClusterRole](t, ofKind(rendered["components.yaml"], "ClusterRole")[0]).Name
	cases := []struct {
		name string
		// namespace is where the Role holding the rule is; "" for the ClusterRole.
		namespace string
		without   func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule
		// lost is what the installer may no longer do once the rule is gone.
		lost authorizationv1.ResourceAttributes
		// want are substrings of JobSet's failure.
		want []string
	}{
		{
			name:    "without escalate the charts' ClusterRoles cannot be written",
			without: withoutVerb("clusterroles", "escalate"),
			lost:    authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "clusterroles", Verb: "escalate", Name: "jobset-controller"},
			want:    []string{`clusterroles.rbac.authorization.k8s.io "jobset-controller" is forbidden`, "attempting to grant RBAC permissions not currently held"},
		},
		{
			name:    "without bind the charts' ClusterRoles cannot be bound",
			without: withoutVerb("clusterroles", "bind"),
			lost:    authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "clusterroles", Verb: "bind", Name: "jobset-controller"},
			want:    []string{`clusterrolebindings.rbac.authorization.k8s.io "jobset-controller" is forbidden`, "attempting to grant RBAC permissions not currently held"},
		},
		{
			name:      "without Helm's records nothing is touched",
			namespace: jobsetNS,
			without: func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
				return slices.DeleteFunc(rules, func(r rbacv1.PolicyRule) bool {
					return slices.Contains(r.Resources, "secrets") && len(r.ResourceNames) == 0
				})
			},
			lost: authorizationv1.ResourceAttributes{Resource: "secrets", Verb: "list", Namespace: jobsetNS},
			want: []string{`secrets is forbidden`, `cannot list resource "secrets"`, `in the namespace "jobset-system"`},
		},
	}
	for _, tc := range cases {
		step(tc.name, func(t *testing.T) {
			var role client.Object = &rbacv1.ClusterRole{}
			key := client.ObjectKey{Name: clusterRoleName}
			if tc.namespace != "" {
				role, key = &rbacv1.Role{}, client.ObjectKey{Namespace: tc.namespace, Name: clusterRoleName}
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
			js := rep.Components[0]
			if js.Component != components.JobSet || js.Action != components.ActionFailed {
				t.Fatalf("JobSet: %+v, want it failed", js)
			}
			for _, w := range tc.want {
				if !strings.Contains(js.Message, w) {
					t.Errorf("JobSet's failure does not say %q: %s", w, js.Message)
				}
			}
			if kueue := rep.Components[1]; kueue.Action != components.ActionFailed || !strings.Contains(kueue.Message, "not attempted") {
				t.Errorf("Kueue: %+v, want it not attempted", kueue)
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
