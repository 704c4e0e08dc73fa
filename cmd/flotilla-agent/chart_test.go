package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/converge"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/test/helmtest"
)

// The chart is rendered with Helm's engine (test/helmtest), as `helm install
// flotilla-agent --namespace flotilla-system -f values.NAME.local.yaml` would render it.

const chartDir = "../../charts/flotilla-agent"

// readChart reads a file of the chart that is data, not a template: values.yaml or the
// schema.
func readChart(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// handoverValues are what `flotilla cluster add` writes for the worker's administrator.
func handoverValues() map[string]any {
	return map[string]any{
		"hub":     map[string]any{"url": "wss://hub.example.com"},
		"cluster": map[string]any{"tenant": "acme", "name": "gpu-a", "identity": agentIdentity},
	}
}

// renderRBAC renders the chart for a release named flotilla-agent in namespace with the
// chart's default values and the handover, and returns the objects of one template,
// in the order Helm installs them.
func renderRBAC(t *testing.T, name, namespace string) []map[string]any {
	t.Helper()
	objs := helmtest.MustRender(t, chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: namespace, Values: handoverValues()})
	var docs []map[string]any
	for _, u := range objs.FromTemplate(name) {
		docs = append(docs, u.Object)
	}
	if len(docs) == 0 {
		t.Fatalf("templates/%s renders nothing", name)
	}
	return docs
}

// decodeInto converts a decoded document into a typed object, strictly.
func decodeInto(t *testing.T, doc map[string]any, out any) {
	t.Helper()
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		t.Fatalf("%s: %v", doc["kind"], err)
	}
}

// grant is one thing a rule allows.
type grant = helmtest.Grant

var grants = helmtest.Grants

// appliersRole is the ClusterRole that agent/apply documents, and tests, as what applying
// and pruning need.
func appliersRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	role, err := apply.DocumentedRole()
	if err != nil {
		t.Fatal(err)
	}
	return role
}

func TestChartClusterRoleIsExactlyWhatTheAgentUses(t *testing.T) {
	docs := renderRBAC(t, "clusterrole.yaml", "flotilla-system")
	if len(docs) != 2 {
		t.Fatalf("clusterrole.yaml holds %d objects, want a ClusterRole and its binding", len(docs))
	}
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	decodeInto(t, docs[0], &role)
	decodeInto(t, docs[1], &binding)

	// The applier's rules, plus the inventory's list of nodes and the reading of a
	// team's own Kueue and JobSet versions: nothing else.
	want := append(appliersRole(t).Rules,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}},
		rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get"}, ResourceNames: converge.Deployments()})
	if got, want := grants(role.Rules), grants(want); !slices.Equal(got, want) {
		t.Errorf("the chart's ClusterRole grants\n%v\nwant\n%v", got, want)
	}
	for _, g := range grants(role.Rules) {
		if g.Resource == "secrets" || g.Verb == "*" || g.Resource == "*" || g.Verb == "watch" || g.Verb == "update" {
			t.Errorf("the ClusterRole grants %+v", g)
		}
	}
	if binding.RoleRef.Name != role.Name || binding.RoleRef.Kind != "ClusterRole" ||
		!slices.Equal(binding.Subjects, []rbacv1.Subject{{Kind: "ServiceAccount", Name: "flotilla-agent", Namespace: "flotilla-system"}}) {
		t.Errorf("the ClusterRoleBinding binds %+v to %+v", binding.RoleRef, binding.Subjects)
	}
}

func TestChartRoleGrantsTheCredentialSecretAndTheReadinessProbeOnly(t *testing.T) {
	docs := renderRBAC(t, "role.yaml", "flotilla-system")
	if len(docs) != 2 {
		t.Fatalf("role.yaml holds %d objects, want a Role and its binding", len(docs))
	}
	var role rbacv1.Role
	var binding rbacv1.RoleBinding
	decodeInto(t, docs[0], &role)
	decodeInto(t, docs[1], &binding)
	want := []grant{
		{Group: "", Resource: "secrets", Verb: "create", Name: defaultCredentialSecret},
		{Group: "", Resource: "secrets", Verb: "get", Name: defaultCredentialSecret},
		{Group: "", Resource: "secrets", Verb: "patch", Name: defaultCredentialSecret},
		{Group: "jobset.x-k8s.io", Resource: "jobsets", Verb: "create", Name: "*"},
	}
	if got := grants(role.Rules); !slices.Equal(got, want) {
		t.Errorf("the chart's Role grants %v, want %v", got, want)
	}
	if role.Namespace != "flotilla-system" || binding.Namespace != "flotilla-system" || binding.RoleRef.Name != role.Name {
		t.Errorf("Role %s/%s, RoleBinding %s/%s to %s", role.Namespace, role.Name, binding.Namespace, binding.Name, binding.RoleRef.Name)
	}
}

// chartValues is the chart's values.yaml.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(readChart(t, "values.yaml")), &v); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	return v
}

func TestChartValuesAreTheAgentsSettings(t *testing.T) {
	v := chartValues(t)
	// The handover names, exactly as `flotilla cluster add` writes them.
	for section, keys := range map[string][]string{
		"hub":        {"url"},
		"cluster":    {"identity", "name", "tenant"},
		"enrollment": {"token"},
	} {
		m, _ := v[section].(map[string]any)
		got := sortedKeys(m)
		if !slices.Equal(got, keys) {
			t.Errorf("values.yaml %s has %v, want %v", section, got, keys)
		}
	}
	// dispatch.clusterRole is not the user's: the chart names its own ClusterRole.
	wantDispatch := slices.DeleteFunc(slices.Clone(valueKeys("dispatch")), func(k string) bool { return k == "clusterRole" })
	if got := sortedKeys(v["dispatch"].(map[string]any)); !slices.Equal(got, wantDispatch) {
		t.Errorf("values.yaml dispatch has %v, want %v", got, wantDispatch)
	}
	if v["dispatch"].(map[string]any)["enabled"] != true {
		t.Errorf("values.yaml turns dispatch off by default")
	}
	// Every agent.* option is one the agent reads. agent.namespace is not among them:
	// the chart runs the agent in the release's namespace.
	agentKeys := sortedKeys(v["agent"].(map[string]any))
	want := slices.DeleteFunc(slices.Clone(valueKeys("agent")), func(k string) bool { return k == "namespace" })
	slices.Sort(want)
	if !slices.Equal(agentKeys, want) {
		t.Errorf("values.yaml agent has %v, want %v", agentKeys, want)
	}

	// What the ConfigMap template renders (hub, cluster and agent, as toYaml would), with
	// the handover filled in, is a values file the agent accepts.
	hub := map[string]any{"url": "wss://hub.example.com"}
	cluster := map[string]any{"tenant": "acme", "name": "gpu-a", "identity": "4-acme-gpu-a"}
	rendered, err := yaml.Marshal(map[string]any{"hub": hub, "cluster": cluster, "agent": v["agent"], "dispatch": v["dispatch"]})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg, _, stderr, code := invoke(t, nil, "--values", writeFile(t, dir, "values.yaml", string(rendered)))
	if code != 0 {
		t.Fatalf("the agent refuses the chart's rendered settings:\n%s\n%s", rendered, stderr)
	}
	if cfg.CredentialSecret != defaultCredentialSecret || cfg.Listen != defaultListen || !cfg.Dispatch {
		t.Errorf("the chart's defaults give credential Secret %q, listen %q and dispatch %v", cfg.CredentialSecret, cfg.Listen, cfg.Dispatch)
	}
}

func TestChartSchemaRequiresTheHandover(t *testing.T) {
	var schema struct {
		Required   []string `json:"required"`
		Properties map[string]struct {
			Required             []string                   `json:"required"`
			AdditionalProperties *bool                      `json:"additionalProperties"`
			Properties           map[string]json.RawMessage `json:"properties"`
		} `json:"properties"`
	}
	if err := json.Unmarshal([]byte(readChart(t, "values.schema.json")), &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if !slices.Contains(schema.Required, "hub") || !slices.Contains(schema.Required, "cluster") ||
		!slices.Equal(schema.Properties["hub"].Required, []string{"url"}) ||
		!slices.Equal(schema.Properties["cluster"].Required, []string{"identity"}) {
		t.Errorf("values.schema.json does not require hub.url and cluster.identity")
	}
	v := chartValues(t)
	if got, want := sortedKeys(schema.Properties), sortedKeys(v); !slices.Equal(got, want) {
		t.Errorf("values.schema.json describes %v; values.yaml has %v", got, want)
	}
	for _, section := range []string{"hub", "cluster", "enrollment", "agent", "dispatch"} {
		p := schema.Properties[section]
		if p.AdditionalProperties == nil || *p.AdditionalProperties {
			t.Errorf("values.schema.json lets %s take unknown settings, which the agent would refuse", section)
		}
		if got, want := sortedKeys(p.Properties), sortedKeys(v[section].(map[string]any)); !slices.Equal(got, want) {
			t.Errorf("values.schema.json %s describes %v; values.yaml has %v", section, got, want)
		}
	}
}

func TestChartDeploymentIsLockedDown(t *testing.T) {
	vals := handoverValues()
	vals["enrollment"] = map[string]any{"token": "stand-in-token"}
	objs := helmtest.MustRender(t, chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: agentNamespace, Values: vals})
	dep := helmtest.Typed[appsv1.Deployment](t, objs.Find("Deployment", "flotilla-agent"))
	if *dep.Spec.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("replicas %d, strategy %s; want one agent, never two at once", *dep.Spec.Replicas, dep.Spec.Strategy.Type)
	}
	spec := dep.Spec.Template.Spec
	c := spec.Containers[0]
	psc, sc := spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("security context %+v / %+v, want non-root, read-only root, no escalation, no capabilities", psc, sc)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes %+v / %+v", c.LivenessProbe, c.ReadinessProbe)
	}
	var fromNamespace bool
	for _, e := range c.Env {
		fromNamespace = fromNamespace || (e.Name == namespaceEnv && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace")
	}
	if !fromNamespace {
		t.Errorf("env %+v lacks %s from the Pod's namespace", c.Env, namespaceEnv)
	}
	if want := []string{"--values=/etc/flotilla-agent/values.yaml", "--enrollment-token-file=/var/run/secrets/flotilla-agent/enrollment/token"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %v, want %v", c.Args, want)
	}
	for _, v := range spec.Volumes {
		if v.Name == "enrollment" && (v.Secret == nil || v.Secret.SecretName != "flotilla-agent-enrollment" || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o400) {
			t.Errorf("the enrollment volume is %+v, want Secret flotilla-agent-enrollment at mode 0400", v.VolumeSource)
		}
	}
	// The token is in the Secret, under key token, and nowhere else.
	sec := helmtest.Typed[corev1.Secret](t, objs.Find("Secret", "flotilla-agent-enrollment"))
	if string(sec.Data["token"]) != "stand-in-token" {
		t.Errorf("the enrollment Secret holds %v", slices.Collect(maps.Keys(sec.Data)))
	}
	for _, o := range objs {
		if o.GetKind() == "Secret" {
			continue
		}
		text, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(text), "stand-in-token") {
			t.Errorf("%s %s from %s holds the enrollment token", o.GetKind(), o.GetName(), o.Template)
		}
	}
	// Redeemed, the token leaves the release: no Secret, no volume, no flag.
	objs = helmtest.MustRender(t, chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: agentNamespace, Values: handoverValues()})
	if len(objs.OfKind("Secret")) > 0 || len(helmtest.Typed[appsv1.Deployment](t, objs.Find("Deployment", "flotilla-agent")).Spec.Template.Spec.Containers[0].Args) != 1 {
		t.Errorf("without a token the chart still renders an enrollment Secret or flag")
	}
}

// dispatchObjects are the objects of templates/dispatch.yaml, typed.
type dispatchObjects struct {
	account            corev1.ServiceAccount
	role               rbacv1.ClusterRole // bound by the agent in the workload namespaces
	watch              rbacv1.ClusterRole
	watchBinding       rbacv1.ClusterRoleBinding
	binder             rbacv1.ClusterRole
	binderBinding      rbacv1.ClusterRoleBinding
	impersonate        rbacv1.Role
	impersonateBinding rbacv1.RoleBinding
}

func renderDispatch(t *testing.T, namespace string) dispatchObjects {
	t.Helper()
	docs := renderRBAC(t, "dispatch.yaml", namespace)
	if len(docs) != 8 {
		t.Fatalf("dispatch.yaml holds %d objects, want a ServiceAccount, three ClusterRoles, a Role and their bindings", len(docs))
	}
	var o dispatchObjects
	named := map[string]any{
		"ServiceAccount/flotilla-dispatch":                  &o.account,
		"ClusterRole/flotilla-agent-dispatch":               &o.role,
		"ClusterRole/flotilla-agent-dispatch-watch":         &o.watch,
		"ClusterRoleBinding/flotilla-agent-dispatch-watch":  &o.watchBinding,
		"ClusterRole/flotilla-agent-dispatch-binder":        &o.binder,
		"ClusterRoleBinding/flotilla-agent-dispatch-binder": &o.binderBinding,
		"Role/flotilla-agent-impersonate-dispatch":          &o.impersonate,
		"RoleBinding/flotilla-agent-impersonate-dispatch":   &o.impersonateBinding,
	}
	for _, doc := range docs {
		meta, _ := doc["metadata"].(map[string]any)
		key := fmt.Sprintf("%v/%v", doc["kind"], meta["name"])
		out, ok := named[key]
		if !ok {
			t.Fatalf("dispatch.yaml renders %s", key)
		}
		decodeInto(t, doc, out)
		delete(named, key)
	}
	return o
}

// The proxy's allowlist is the one source of the dispatch identity's rules: the chart
// must grant exactly those, what MultiKueue does to one object only where the agent binds
// it, so that neither refuses what the other lets through.
func TestChartDispatchRoleIsExactlyTheProxysAllowlist(t *testing.T) {
	o := renderDispatch(t, "flotilla-system")
	off := handoverValues()
	off["dispatch"] = map[string]any{"enabled": false}
	if objs := helmtest.MustRender(t, chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: agentNamespace, Values: off}).FromTemplate("dispatch.yaml"); len(objs) > 0 {
		t.Errorf("with dispatch.enabled false, dispatch.yaml still renders %d objects", len(objs))
	}
	rules := proxy.Allowlist(proxy.DefaultIntegrations())
	if got, want := grants(o.role.Rules), grants(proxy.NamespacedPolicyRules(rules)); !slices.Equal(got, want) {
		t.Errorf("the chart's namespaced dispatch ClusterRole grants\n%v\nthe proxy's allowlist is\n%v", got, want)
	}
	if got, want := grants(o.watch.Rules), grants(proxy.ClusterPolicyRules(rules)); !slices.Equal(got, want) {
		t.Errorf("the chart's cluster-wide dispatch ClusterRole grants\n%v\nthe proxy's allowlist is\n%v", got, want)
	}
	for _, g := range grants(o.watch.Rules) {
		if g.Verb != "list" && g.Verb != "watch" {
			t.Errorf("the dispatch identity may %s %s in every namespace", g.Verb, g.Resource)
		}
	}
	if o.account.Name != proxy.DefaultServiceAccount || o.account.Namespace != "flotilla-system" ||
		o.account.AutomountServiceAccountToken == nil || *o.account.AutomountServiceAccountToken {
		t.Errorf("the dispatch ServiceAccount is %s/%s, automount %v", o.account.Namespace, o.account.Name, o.account.AutomountServiceAccountToken)
	}
	dispatchSubject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: proxy.DefaultServiceAccount, Namespace: "flotilla-system"}}
	agentSubject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "flotilla-agent", Namespace: "flotilla-system"}}
	if o.watchBinding.RoleRef.Name != o.watch.Name || o.watchBinding.RoleRef.Kind != "ClusterRole" || !slices.Equal(o.watchBinding.Subjects, dispatchSubject) {
		t.Errorf("the dispatch ClusterRoleBinding binds %+v to %+v", o.watchBinding.RoleRef, o.watchBinding.Subjects)
	}
	// The agent may write the RoleBindings of the namespaced role, of its name only, and
	// bind that role and no other.
	wantBinder := []grant{
		{Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Verb: "bind", Name: o.role.Name},
		{Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Verb: "create", Name: o.role.Name},
		{Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Verb: "delete", Name: o.role.Name},
		{Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Verb: "get", Name: o.role.Name},
		{Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Verb: "list", Name: "*"},
		{Group: "rbac.authorization.k8s.io", Resource: "rolebindings", Verb: "patch", Name: o.role.Name},
	}
	if got := grants(o.binder.Rules); !slices.Equal(got, wantBinder) {
		t.Errorf("the agent's binder role grants\n%v\nwant\n%v", got, wantBinder)
	}
	if o.binderBinding.RoleRef.Name != o.binder.Name || !slices.Equal(o.binderBinding.Subjects, agentSubject) {
		t.Errorf("the binder ClusterRoleBinding binds %+v to %+v", o.binderBinding.RoleRef, o.binderBinding.Subjects)
	}
	// The agent learns the namespaced role's name from the chart.
	var cm corev1.ConfigMap
	decodeInto(t, renderRBAC(t, "configmap.yaml", "flotilla-system")[0], &cm)
	if !strings.Contains(cm.Data["values.yaml"], "clusterRole: "+o.role.Name) {
		t.Errorf("the agent's settings do not name the dispatch ClusterRole %s:\n%s", o.role.Name, cm.Data["values.yaml"])
	}
	// The agent may impersonate that one account and nothing else.
	if got, want := grants(o.impersonate.Rules), []grant{{Group: "", Resource: "serviceaccounts", Verb: "impersonate", Name: proxy.DefaultServiceAccount}}; !slices.Equal(got, want) {
		t.Errorf("the impersonation Role grants %v, want %v", got, want)
	}
	if o.impersonate.Namespace != "flotilla-system" || o.impersonateBinding.Namespace != "flotilla-system" ||
		o.impersonateBinding.RoleRef.Name != o.impersonate.Name || o.impersonateBinding.RoleRef.Kind != "Role" ||
		!slices.Equal(o.impersonateBinding.Subjects, agentSubject) {
		t.Errorf("the impersonation RoleBinding binds %+v to %+v", o.impersonateBinding.RoleRef, o.impersonateBinding.Subjects)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
