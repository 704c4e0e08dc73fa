package installer

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// need is one thing the installer must be allowed: verb on resource (group/resource)
// named name ("" for any) in namespace ("" for cluster-scoped).
type need struct{ namespace, group, resource, verb, name string }

func (n need) String() string {
	name := n.name
	if name == "" {
		name = "*"
	}
	where := "cluster-wide"
	if n.namespace != "" {
		where = "in " + n.namespace
	}
	resource := n.resource
	if n.group != "" {
		resource += "." + n.group
	}
	return fmt.Sprintf("%s %s %s %s", n.verb, resource, name, where)
}

// kinds are the kinds the charts render: their resource, and whether they are
// cluster-scoped. A kind missing here is one RBAC.md does not cover yet.
var kinds = map[string]struct {
	group, resource string
	cluster         bool
}{
	"CustomResourceDefinition":       {"apiextensions.k8s.io", "customresourcedefinitions", true},
	"ClusterRole":                    {rbacv1.GroupName, "clusterroles", true},
	"ClusterRoleBinding":             {rbacv1.GroupName, "clusterrolebindings", true},
	"MutatingWebhookConfiguration":   {"admissionregistration.k8s.io", "mutatingwebhookconfigurations", true},
	"ValidatingWebhookConfiguration": {"admissionregistration.k8s.io", "validatingwebhookconfigurations", true},
	"APIService":                     {"apiregistration.k8s.io", "apiservices", true},
	"Role":                           {rbacv1.GroupName, "roles", false},
	"RoleBinding":                    {rbacv1.GroupName, "rolebindings", false},
	"Secret":                         {"", "secrets", false},
	"ConfigMap":                      {"", "configmaps", false},
	"Service":                        {"", "services", false},
	"ServiceAccount":                 {"", "serviceaccounts", false},
	"Deployment":                     {"apps", "deployments", false},
}

// rendered is what the installer's Helm install of c at version writes.
func rendered(t *testing.T, c components.Component, version string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := Rendered(c, version)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// aggregated says whether a rendered ClusterRole has an aggregationRule: the API server
// fills its rules from the ClusterRoles its selectors match, and lets only an identity
// that holds everything (or escalate on it) write it.
func aggregated(u *unstructured.Unstructured) bool {
	_, ok := u.Object["aggregationRule"]
	return ok
}

// needs is what installing, upgrading, adopting and uninstalling c at version asks of
// the API server: for each object, reading it, creating and patching it by server-side
// apply and deleting it (never a CRD, which the installer keeps); escalate on each
// aggregated role; bind on each role a binding names that the charts do not render
// (Kubernetes' own), since the rules of the charts' other roles are held (see
// TestRBACDocumentHoldsWhatTheChartsRolesGrant); Helm's records in the release
// namespace, and applying that namespace.
func needs(t *testing.T, c components.Component, version string) []need {
	t.Helper()
	objs := rendered(t, c, version)
	releaseNS := components.Namespace(c)
	held := map[string]bool{}
	for _, o := range objs {
		if (o.GetKind() == "ClusterRole" || o.GetKind() == "Role") && !aggregated(o) {
			held[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = true
		}
	}
	out := []need{{"", "", "namespaces", "patch", releaseNS}}
	for _, v := range []string{"get", "list", "create", "update", "delete"} {
		out = append(out, need{releaseNS, "", "secrets", v, ""})
	}
	for _, o := range objs {
		kind, name := o.GetKind(), o.GetName()
		k, ok := kinds[kind]
		if !ok {
			t.Errorf("%s %s renders a %s %s, a kind RBAC.md does not cover", c, version, kind, name)
			continue
		}
		ns := ""
		if !k.cluster {
			ns = o.GetNamespace()
		}
		verbs := []string{"get", "create", "patch", "delete"}
		switch kind {
		case "CustomResourceDefinition":
			verbs = verbs[:3]
		case "ClusterRole", "Role":
			if aggregated(o) {
				verbs = append(verbs, "escalate")
			}
		case "ClusterRoleBinding", "RoleBinding":
			refKind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
			refName, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			refNS := ""
			if refKind == "Role" {
				refNS = ns
			}
			if held[refKind+"/"+refNS+"/"+refName] {
				break
			}
			if refKind == "ClusterRole" {
				out = append(out, need{"", rbacv1.GroupName, "clusterroles", "bind", refName})
			} else {
				out = append(out, need{ns, rbacv1.GroupName, "roles", "bind", refName})
			}
		}
		for _, v := range verbs {
			out = append(out, need{ns, k.group, k.resource, v, name})
		}
	}
	return out
}

// granted expands rules, of a Role in namespace or of the ClusterRole ("").
func granted(rules []rbacv1.PolicyRule, namespace string) []need {
	var out []need
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, need{namespace, g, res, v, n})
					}
				}
			}
		}
	}
	return out
}

// RBAC.md names exactly the objects the embedded charts render: every one of them can be
// written, and nothing else can. A chart version that adds an object fails here until
// RBAC.md, and with it the agent's chart, grants it.
func TestRBACDocumentNamesExactlyTheObjectsOfTheEmbeddedCharts(t *testing.T) {
	doc, err := DocumentedRBAC()
	if err != nil {
		t.Fatal(err)
	}
	have := granted(doc.ClusterRole.Rules, "")
	for _, r := range doc.Roles {
		have = append(have, granted(r.Rules, r.Namespace)...)
	}
	covers := func(g, n need) bool {
		return g.namespace == n.namespace && g.group == n.group && g.resource == n.resource && g.verb == n.verb && (g.name == "" || g.name == n.name)
	}

	var want []need
	for _, c := range components.All() {
		for _, v := range components.Installable(c) {
			want = append(want, needs(t, c, v)...)
		}
	}
	for _, n := range want {
		if !slices.ContainsFunc(have, func(g need) bool { return covers(g, n) }) {
			t.Errorf("the installer must %s, which RBAC.md does not grant", n)
		}
	}
	for _, g := range have {
		if !slices.Contains(want, g) {
			t.Errorf("RBAC.md grants %s, which no embedded chart needs", g)
		}
	}
	// The one rule without names is Helm's records, whose names change with each revision.
	for _, g := range have {
		if g.name == "" && (g.resource != "secrets" || g.namespace == "") {
			t.Errorf("RBAC.md grants %s without names", g)
		}
	}
}

// held is one permission a role grants: verb on a resource of a group, on the object of
// that name ("" for any), or on a non-resource URL, in namespace ("" cluster-wide).
type held struct{ namespace, group, resource, name, url, verb string }

// holds expands rules, of a Role in namespace or of a ClusterRole ("").
func holds(rules []rbacv1.PolicyRule, namespace string) []held {
	var out []held
	for _, r := range rules {
		for _, v := range r.Verbs {
			for _, u := range r.NonResourceURLs {
				out = append(out, held{namespace: namespace, url: u, verb: v})
			}
			names := r.ResourceNames
			if len(names) == 0 {
				names = []string{""}
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, n := range names {
						out = append(out, held{namespace, g, res, n, "", v})
					}
				}
			}
		}
	}
	return out
}

// heldRules writes grants of one namespace as compact rules, one per group, names, URL
// and verbs, the way RBAC.md lists them.
func heldRules(grants []held) []rbacv1.PolicyRule {
	type key struct{ group, name, url string }
	verbs := map[key]map[string][]string{}
	for _, g := range grants {
		k := key{g.group, g.name, g.url}
		if verbs[k] == nil {
			verbs[k] = map[string][]string{}
		}
		if !slices.Contains(verbs[k][g.resource], g.verb) {
			verbs[k][g.resource] = append(verbs[k][g.resource], g.verb)
		}
	}
	var out []rbacv1.PolicyRule
	for _, k := range slices.SortedFunc(maps.Keys(verbs), func(a, b key) int {
		return cmp.Or(strings.Compare(a.url, b.url), strings.Compare(a.group, b.group), strings.Compare(a.name, b.name))
	}) {
		byVerbs := map[string][]string{}
		for res, vs := range verbs[k] {
			slices.Sort(vs)
			byVerbs[strings.Join(vs, ",")] = append(byVerbs[strings.Join(vs, ",")], res)
		}
		var rules []rbacv1.PolicyRule
		for vs, resources := range byVerbs {
			slices.Sort(resources)
			r := rbacv1.PolicyRule{Verbs: strings.Split(vs, ",")}
			if k.url != "" {
				r.NonResourceURLs = []string{k.url}
			} else {
				r.APIGroups, r.Resources = []string{k.group}, resources
			}
			if k.name != "" {
				r.ResourceNames = []string{k.name}
			}
			rules = append(rules, r)
		}
		slices.SortFunc(rules, func(a, b rbacv1.PolicyRule) int {
			return cmp.Compare(strings.Join(a.Resources, ","), strings.Join(b.Resources, ","))
		})
		out = append(out, rules...)
	}
	return out
}

// The installer holds exactly what the charts' roles grant, each Role's in its
// namespace, so that the API server lets it write those roles and bind them without
// escalate or bind: it may write a role that grants what it holds itself, and bind a
// role whose every rule it holds. The aggregated ClusterRoles are the exception: their
// rules are whatever the ClusterRoles their selectors match grant, and writing one needs
// escalate on it or every permission there is.
func TestRBACDocumentHoldsWhatTheChartsRolesGrant(t *testing.T) {
	doc, err := DocumentedRBAC()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]held{}
	for _, c := range components.All() {
		for _, v := range components.Installable(c) {
			for _, o := range rendered(t, c, v) {
				if (o.GetKind() != "ClusterRole" && o.GetKind() != "Role") || aggregated(o) {
					continue
				}
				var role rbacv1.ClusterRole
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
					t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
				}
				want[o.GetNamespace()] = append(want[o.GetNamespace()], holds(role.Rules, o.GetNamespace())...)
			}
		}
	}
	have := map[string][]held{"": holds(doc.Controllers.Rules, "")}
	for _, r := range doc.ControllersRoles {
		have[r.Namespace] = append(have[r.Namespace], holds(r.Rules, r.Namespace)...)
	}
	namespaces := map[string]bool{}
	for ns := range want {
		namespaces[ns] = true
	}
	for ns := range have {
		namespaces[ns] = true
	}
	for _, ns := range slices.Sorted(maps.Keys(namespaces)) {
		w, h := want[ns], have[ns]
		var missing, extra []string
		for _, g := range w {
			if !slices.Contains(h, g) {
				missing = append(missing, fmt.Sprintf("%+v", g))
			}
		}
		for _, g := range h {
			if !slices.Contains(w, g) {
				extra = append(extra, fmt.Sprintf("%+v", g))
			}
		}
		if len(missing) == 0 && len(extra) == 0 {
			continue
		}
		slices.Sort(missing)
		slices.Sort(extra)
		missing, extra = slices.Compact(missing), slices.Compact(extra)
		where := "the ClusterRole " + controllersName
		if ns != "" {
			where = "the Role " + controllersName + " in " + ns
		}
		rules, _ := yaml.Marshal(heldRules(w))
		t.Errorf("%s must hold what the charts' roles grant there; it lacks\n%s\nand grants besides\n%s\nRBAC.md's rules for it are:\n%s",
			where, strings.Join(missing, "\n"), strings.Join(extra, "\n"), rules)
	}
}
