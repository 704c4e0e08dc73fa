package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
)

var updatePolicy = flag.Bool("update", false, "rewrite the chart's files/components-policy.json from the embedded charts")

// policyFile is what the chart's admission policy for the installer admits, derived from
// the embedded charts (installer.Rendered). The template turns each field into a CEL
// literal; keys name objects as the policy computes them from a request:
// group/resource/namespace/name.
const policyFile = "files/components-policy.json"

// componentsPolicy is the content of policyFile.
type componentsPolicy struct {
	// Objects are every object the charts render, and the release namespaces Helm
	// applies.
	Objects map[string]bool `json:"objects"`
	// Releases names, by release namespace, the Helm release whose records
	// (sh.helm.release.v1.<release>.v<n>) the installer writes there.
	Releases map[string]string `json:"releases"`
	// RoleRules are, for each non-aggregated role, its rules as ruleString writes them,
	// once per chart version.
	RoleRules map[string][][]string `json:"roleRules"`
	// Aggregated are, for each aggregated ClusterRole, its aggregationRule's selectors,
	// each as its matchLabels written key=value, once per chart version.
	Aggregated map[string][][][]string `json:"aggregated"`
	// AggregationLabels are the label keys the charts' aggregation rules select on.
	AggregationLabels map[string]bool `json:"aggregationLabels"`
	// RoleLabels are the labels of each role that aggregate it into another: those keys,
	// and rbac.authorization.k8s.io/aggregate-to-*.
	RoleLabels map[string]map[string]string `json:"roleLabels"`
	// Bindings are, for each binding, its roleRef (Kind/name) followed by its subjects
	// (Kind/namespace/name), once per chart version.
	Bindings map[string][][]string `json:"bindings"`
	// Services are, for each webhook configuration and APIService, the Services
	// (namespace/name) it may send requests to.
	Services map[string][]string `json:"services"`
}

// policyKey names an object as the policy does: the namespace of a namespaced object,
// none for a cluster-scoped one.
func policyKey(gvk schema.GroupVersionKind, namespace, name string) string {
	plural, _ := meta.UnsafeGuessKindToResource(gvk)
	return gvk.Group + "/" + plural.Resource + "/" + namespace + "/" + name
}

// ruleString writes a rule as the policy's CEL does, field by field in their order.
func ruleString(r rbacv1.PolicyRule) string {
	return "apiGroups=" + strings.Join(r.APIGroups, ",") + " resources=" + strings.Join(r.Resources, ",") +
		" resourceNames=" + strings.Join(r.ResourceNames, ",") + " nonResourceURLs=" + strings.Join(r.NonResourceURLs, ",") +
		" verbs=" + strings.Join(r.Verbs, ",")
}

// addOnce appends v to the alternatives of key unless an equal one is there: two chart
// versions that render a role alike admit it once.
func addOnce[T any](m map[string][]T, key string, v T) {
	for _, have := range m[key] {
		a, _ := json.Marshal(have)
		b, _ := json.Marshal(v)
		if bytes.Equal(a, b) {
			return
		}
	}
	m[key] = append(m[key], v)
}

// wantPolicy derives the policy's content from every chart version this build installs.
func wantPolicy(t *testing.T) componentsPolicy {
	t.Helper()
	p := componentsPolicy{
		Objects: map[string]bool{}, Releases: map[string]string{}, RoleRules: map[string][][]string{},
		Aggregated: map[string][][][]string{}, AggregationLabels: map[string]bool{}, RoleLabels: map[string]map[string]string{},
		Bindings: map[string][][]string{}, Services: map[string][]string{},
	}
	var objs []*unstructured.Unstructured
	for _, c := range components.All() {
		ns := components.Namespace(c)
		p.Releases[ns] = components.ReleaseName(c)
		p.Objects[policyKey(schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, "", ns)] = true
		for _, v := range components.Installable(c) {
			rendered, err := installer.Rendered(c, v)
			if err != nil {
				t.Fatal(err)
			}
			objs = append(objs, rendered...)
		}
	}
	typed := func(u *unstructured.Unstructured, out any) {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	for _, u := range objs {
		if u.GetKind() == "ClusterRole" {
			var role rbacv1.ClusterRole
			typed(u, &role)
			if role.AggregationRule != nil {
				for _, s := range role.AggregationRule.ClusterRoleSelectors {
					for k := range s.MatchLabels {
						p.AggregationLabels[k] = true
					}
				}
			}
		}
	}
	for _, u := range objs {
		key := policyKey(u.GroupVersionKind(), u.GetNamespace(), u.GetName())
		p.Objects[key] = true
		switch u.GetKind() {
		case "ClusterRole", "Role":
			var role rbacv1.ClusterRole
			typed(u, &role)
			if role.AggregationRule != nil {
				var selectors [][]string
				for _, s := range role.AggregationRule.ClusterRoleSelectors {
					if len(s.MatchExpressions) > 0 {
						t.Fatalf("%s %s selects by expressions, which the policy does not compare", u.GetKind(), u.GetName())
					}
					var labels []string
					for k, v := range s.MatchLabels {
						labels = append(labels, k+"="+v)
					}
					slices.Sort(labels)
					selectors = append(selectors, labels)
				}
				addOnce(p.Aggregated, key, selectors)
			} else {
				rules := []string{}
				for _, r := range role.Rules {
					rules = append(rules, ruleString(r))
				}
				addOnce(p.RoleRules, key, rules)
			}
			for k, v := range u.GetLabels() {
				if p.AggregationLabels[k] || strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
					if p.RoleLabels[key] == nil {
						p.RoleLabels[key] = map[string]string{}
					}
					p.RoleLabels[key][k] = v
				}
			}
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.RoleBinding
			typed(u, &b)
			binding := []string{b.RoleRef.Kind + "/" + b.RoleRef.Name}
			for _, s := range b.Subjects {
				binding = append(binding, s.Kind+"/"+s.Namespace+"/"+s.Name)
			}
			addOnce(p.Bindings, key, binding)
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
			webhooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
			for _, w := range webhooks {
				w, _ := w.(map[string]any)
				ns, _, _ := unstructured.NestedString(w, "clientConfig", "service", "namespace")
				name, _, _ := unstructured.NestedString(w, "clientConfig", "service", "name")
				if name == "" {
					t.Fatalf("%s %s has a webhook without a Service", u.GetKind(), u.GetName())
				}
				if !slices.Contains(p.Services[key], ns+"/"+name) {
					p.Services[key] = append(p.Services[key], ns+"/"+name)
				}
			}
		case "APIService":
			ns, _, _ := unstructured.NestedString(u.Object, "spec", "service", "namespace")
			name, _, _ := unstructured.NestedString(u.Object, "spec", "service", "name")
			if !slices.Contains(p.Services[key], ns+"/"+name) {
				p.Services[key] = append(p.Services[key], ns+"/"+name)
			}
		}
	}
	return p
}

// The chart's admission policy admits what the embedded charts render, read from a file
// the chart carries: a chart version that renders another role, rule, binding or webhook
// fails here until the file is written again (go test ./cmd/flotilla-agent -run
// TestChartComponentsPolicyIsWhatTheEmbeddedChartsRender -update) and the change reviewed.
func TestChartComponentsPolicyIsWhatTheEmbeddedChartsRender(t *testing.T) {
	want, err := json.MarshalIndent(wantPolicy(t), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	path := filepath.Join(chartDir, policyFile)
	if *updatePolicy {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if diff := cmp.Diff(string(got), string(want)); diff != "" {
		t.Errorf("%s differs from what the embedded charts render (-file +charts); if the change is meant, run with -update and review the diff:\n%s", policyFile, diff)
	}
}
