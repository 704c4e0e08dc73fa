// Package helmtest renders and lints the project's Helm charts in tests with the Helm
// SDK, as `helm install` (or `helm template`) and `helm lint` would, so that a test
// asserts on the objects a user's cluster receives rather than on template text.
//
// Render returns the rendered objects in the order Helm installs them (by kind, as
// Helm's InstallOrder says, then as they appear in the templates), each with the
// template it came from; the chart's values schema is checked first, and a template's
// fail ends the render with its message, as it ends an install. Lint runs Helm's
// linter over a chart with a values file, as chart-testing does with ci/*-values.yaml.
package helmtest

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// Options say how a chart is rendered.
type Options struct {
	// Release and Namespace are the release's name and namespace, as in
	// `helm install RELEASE --namespace NAMESPACE`.
	Release, Namespace string
	// Values are merged over the chart's values.yaml, as a values file given with -f.
	Values map[string]any
	// Config, when set, is the API server the chart's lookup calls read, as during an
	// install; without it they find nothing, as in `helm template`.
	Config *rest.Config
}

// Object is one rendered object and the template it came from.
type Object struct {
	// Template is the template's path inside the chart, e.g. templates/service.yaml.
	Template string
	*unstructured.Unstructured
}

// Objects are the rendered objects of a chart, in install order.
type Objects []Object

// Render renders the chart in dir with opts. The error is the schema's or the
// templates' (a fail's message included), as `helm install` would print it.
func Render(dir string, opts Options) (Objects, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", dir, err)
	}
	top, err := chartutil.ToRenderValues(ch, opts.Values, common.ReleaseOptions{Name: opts.Release, Namespace: opts.Namespace, IsInstall: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", ch.Name(), err)
	}
	var files map[string]string
	if opts.Config != nil {
		files, err = engine.RenderWithClient(ch, top, opts.Config)
	} else {
		files, err = engine.Render(ch, top)
	}
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", ch.Name(), err)
	}
	// Helm installs what its manifest sorter returns: partials, NOTES.txt and empty
	// files left out, the rest by kind.
	for name := range files {
		if !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml") {
			delete(files, name)
		}
	}
	_, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", ch.Name(), err)
	}
	var out Objects
	for _, m := range manifests {
		u := &unstructured.Unstructured{}
		if err := yaml.UnmarshalStrict([]byte(m.Content), &u.Object); err != nil {
			return nil, fmt.Errorf("chart %s: %s: %w", ch.Name(), m.Name, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		// The manifest's name is chart/templates/...: keep the path inside the chart.
		_, tmpl, _ := strings.Cut(m.Name, "/")
		out = append(out, Object{Template: tmpl, Unstructured: u})
	}
	return out, nil
}

// MustRender is Render that fails the test on an error.
func MustRender(tb testing.TB, dir string, opts Options) Objects {
	tb.Helper()
	objs, err := Render(dir, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return objs
}

// FromTemplate returns the objects of one template, named by its file name
// (deployment.yaml) or its path in the chart (templates/deployment.yaml).
func (o Objects) FromTemplate(name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, obj := range o {
		if obj.Template == name || path.Base(obj.Template) == name {
			out = append(out, obj.Unstructured)
		}
	}
	return out
}

// OfKind returns the objects of a kind.
func (o Objects) OfKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, obj := range o {
		if obj.GetKind() == kind {
			out = append(out, obj.Unstructured)
		}
	}
	return out
}

// Find returns the object of a kind and name, or nil.
func (o Objects) Find(kind, name string) *unstructured.Unstructured {
	for _, obj := range o {
		if obj.GetKind() == kind && obj.GetName() == name {
			return obj.Unstructured
		}
	}
	return nil
}

// YAML is the objects as `helm template` prints them: each after a --- line and a
// comment naming its template. Keys are sorted, so the text is stable.
func (o Objects) YAML() ([]byte, error) {
	var b bytes.Buffer
	for _, obj := range o {
		data, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s", obj.Template, data)
	}
	return b.Bytes(), nil
}

// Typed converts a rendered object into its Go type, strictly: a field the type does
// not have fails the test, as the API server would refuse it.
func Typed[T any](tb testing.TB, u *unstructured.Unstructured) *T {
	tb.Helper()
	out := new(T)
	data, err := u.MarshalJSON()
	if err != nil {
		tb.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		tb.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

// CRDs returns the objects of the chart's crds/ directory, which Helm installs before
// the templates and never renders.
func CRDs(dir string) ([]*unstructured.Unstructured, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, crd := range ch.CRDObjects() {
		for _, doc := range releaseutil.SplitManifests(string(crd.File.Data)) {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				return nil, fmt.Errorf("chart %s: %s: %w", ch.Name(), crd.Name, err)
			}
			if len(u.Object) > 0 {
				out = append(out, u)
			}
		}
	}
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, nil
}

// ValuesFile reads a values file, such as one of a chart's ci/*-values.yaml.
func ValuesFile(tb testing.TB, file string) map[string]any {
	tb.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		tb.Fatal(err)
	}
	vals := map[string]any{}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		tb.Fatalf("%s: %v", file, err)
	}
	return vals
}

// Lint runs `helm lint --strict --namespace NAMESPACE` over the chart in dir with
// values, and returns every warning and error it reports, each as Helm prints it.
// Helm's linter renders the templates in lint mode, where fail does not stop the
// render: a refusal is Render's to check.
func Lint(dir, namespace string, values map[string]any) []string {
	l := action.NewLint()
	l.Namespace = namespace
	l.Strict = true
	res := l.Run([]string{dir}, values)
	var out []string
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			out = append(out, m.Error())
		}
	}
	// Errors repeats the messages at or above the tolerance, and adds what stopped a
	// chart from being linted at all.
	for _, err := range res.Errors {
		if !slices.ContainsFunc(res.Messages, func(m support.Message) bool { return m.Err == err }) {
			out = append(out, err.Error())
		}
	}
	if res.TotalChartsLinted != 1 && len(out) == 0 {
		out = append(out, fmt.Sprintf("%s: no chart was linted", dir))
	}
	return out
}

// Grant is one thing an RBAC rule allows: a verb on a resource of an API group, on the
// object of that name ("*" for any).
type Grant struct{ Group, Resource, Verb, Name string }

// Grants flattens rules into what they allow, sorted and without repeats, so that two
// sets of rules written differently compare equal when they allow the same.
func Grants(rules []rbacv1.PolicyRule) []Grant {
	var out []Grant
	for _, r := range rules {
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{"*"}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						out = append(out, Grant{g, res, v, n})
					}
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Grant) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Resource, b.Resource), strings.Compare(a.Verb, b.Verb), strings.Compare(a.Name, b.Name))
	})
	return slices.Compact(out)
}
