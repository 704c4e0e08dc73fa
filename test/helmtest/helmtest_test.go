package helmtest

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const exampleChart = "testdata/chart"

func TestRenderReturnsObjectsInHelmsInstallOrderWithTheirTemplates(t *testing.T) {
	objs := MustRender(t, exampleChart, Options{Release: "hello", Namespace: "demo", Values: map[string]any{"greeting": "hi", "port": 9090}})
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()+" from "+o.Template)
	}
	// Helm installs ServiceAccounts and ConfigMaps before Services, whatever the files
	// say; NOTES.txt is no object.
	want := []string{
		"ServiceAccount demo/hello from templates/serviceaccount.yaml",
		"ConfigMap demo/hello from templates/service.yaml",
		"Service demo/hello from templates/service.yaml",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rendered\n%v\nwant\n%v", got, want)
	}
	if svc := Typed[corev1.Service](t, objs.Find("Service", "hello")); svc.Spec.Ports[0].Port != 9090 {
		t.Errorf("the Service listens on %d, want the value's 9090", svc.Spec.Ports[0].Port)
	}
	if n := len(objs.FromTemplate("service.yaml")); n != 2 {
		t.Errorf("service.yaml renders %d objects, want 2", n)
	}
	text, err := objs.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(text), "---\n# Source: templates/serviceaccount.yaml\napiVersion: v1\nkind: ServiceAccount\n") {
		t.Errorf("YAML() begins\n%.120s", text)
	}
}

func TestRenderRefusesAsHelmInstallWould(t *testing.T) {
	tests := []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"a template's fail", nil, "greeting: say something"},
		{"the schema", map[string]any{"greeting": "hi", "port": 0}, "/port"},
		{"an unknown value", map[string]any{"greeting": "hi", "colour": "blue"}, "colour"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Render(exampleChart, Options{Release: "hello", Namespace: "demo", Values: tt.values})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Render: %v, want an error with %q", err, tt.want)
			}
		})
	}
}

func TestLintReportsWhatHelmLintStrictReports(t *testing.T) {
	if msgs := Lint(exampleChart, "demo", map[string]any{"greeting": "hi"}); len(msgs) > 0 {
		t.Errorf("a clean chart lints with %v", msgs)
	}
	msgs := Lint(exampleChart, "demo", map[string]any{"greeting": "hi", "port": "eighty"})
	if !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, "/port") }) {
		t.Errorf("a value against the schema lints with %v", msgs)
	}
	if msgs := Lint("testdata/no-such-chart", "demo", nil); len(msgs) == 0 {
		t.Error("a missing chart lints clean")
	}
}

func TestCRDsAreTheChartsCRDsDirectory(t *testing.T) {
	crds, err := CRDs(exampleChart)
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) != 1 || crds[0].GetName() != "widgets.example.com" || crds[0].GetKind() != "CustomResourceDefinition" {
		t.Errorf("CRDs = %v", crds)
	}
}
