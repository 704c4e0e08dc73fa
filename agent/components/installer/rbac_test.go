package installer

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	rbacv1 "k8s.io/api/rbac/v1"
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

// rendered is what the installer's Helm install of c writes: the chart's templates with
// the values the installer sets, and the CRDs of its crds/.
func rendered(t *testing.T, c components.Component, version string) ([]map[string]any, string) {
	t.Helper()
	in := &Installer{}
	spec := components.Spec{Managed: true, Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset"}}
	if c == components.Kueue {
		spec.Kueue.Version = version
	} else {
		spec.JobSet.Version = version
	}
	tgt, err := in.load(c, spec)
	if err != nil {
		t.Fatal(err)
	}
	top, err := chartutil.ToRenderValues(tgt.chart, tgt.values, common.ReleaseOptions{Name: tgt.name, Namespace: tgt.namespace, IsInstall: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(tgt.chart, top)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for name, text := range files {
		if strings.HasSuffix(name, ".yaml") {
			texts = append(texts, text)
		}
	}
	for _, crd := range tgt.chart.CRDObjects() {
		texts = append(texts, string(crd.File.Data))
	}
	var out []map[string]any
	for _, text := range texts {
		docs := releaseutil.SplitManifests(text)
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			var m map[string]any
			if err := yaml.Unmarshal([]byte(docs[k]), &m); err != nil {
				t.Fatal(err)
			}
			if len(m) > 0 {
				out = append(out, m)
			}
		}
	}
	return out, tgt.namespace
}

// needs is what installing, upgrading, adopting and uninstalling c at version asks of
// the API server: for each object, reading it, creating and patching it by server-side
// apply and deleting it (never a CRD, which the installer keeps); escalate on each role
// and bind on each role a binding names; Helm's records in the release namespace, and
// applying that namespace.
func needs(t *testing.T, c components.Component, version string) []need {
	t.Helper()
	objs, releaseNS := rendered(t, c, version)
	out := []need{{"", "", "namespaces", "patch", releaseNS}}
	for _, v := range []string{"get", "list", "create", "update", "delete"} {
		out = append(out, need{releaseNS, "", "secrets", v, ""})
	}
	for _, o := range objs {
		kind, _ := o["kind"].(string)
		meta, _ := o["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		k, ok := kinds[kind]
		if !ok {
			t.Errorf("%s %s renders a %s %s, a kind RBAC.md does not cover", c, version, kind, name)
			continue
		}
		ns := ""
		if !k.cluster {
			ns, _ = meta["namespace"].(string)
			if ns == "" {
				ns = releaseNS
			}
		}
		verbs := []string{"get", "create", "patch", "delete"}
		switch kind {
		case "CustomResourceDefinition":
			verbs = verbs[:3]
		case "ClusterRole", "Role":
			verbs = append(verbs, "escalate")
		case "ClusterRoleBinding", "RoleBinding":
			ref, _ := o["roleRef"].(map[string]any)
			refKind, _ := ref["kind"].(string)
			refName, _ := ref["name"].(string)
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
