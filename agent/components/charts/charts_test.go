package charts

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// What the hub accepts in fleet.yaml is exactly what the agent's build can install:
// every installable version has its chart embedded, and no chart is embedded that
// the list does not name.
func TestTheInstallableVersionsAreTheEmbeddedCharts(t *testing.T) {
	for _, c := range components.All() {
		if got, want := Versions(c), components.Installable(c); !slices.Equal(got, want) {
			t.Errorf("%s: charts embedded for %v, components.Installable says %v: run make generate and update the list", c, got, want)
		}
	}
}

// Each embedded archive is the component's own chart at that version, with its license
// beside it: Helm finds Chart.yaml under a directory named after the chart.
func TestEachArchiveIsTheComponentsChartAtItsVersion(t *testing.T) {
	for _, c := range components.All() {
		for _, v := range components.Installable(c) {
			b, err := Archive(c, v)
			if err != nil {
				t.Fatal(err)
			}
			meta := chartYAML(t, b, string(c)+"/Chart.yaml")
			if meta.Name != string(c) || "v"+strings.TrimPrefix(meta.Version, "v") != v {
				t.Errorf("%s-%s.tgz holds chart %s %s", c, v, meta.Name, meta.Version)
			}
			if lic, err := License(c); err != nil || !bytes.Contains(lic, []byte("Apache License")) {
				t.Errorf("%s: no Apache license beside the chart: %v", c, err)
			}
		}
	}
}

func TestAnUnknownVersionIsRefusedWithTheVersionsThereAre(t *testing.T) {
	_, err := Archive(components.Kueue, "v0.9.9")
	if err == nil || !strings.Contains(err.Error(), "v0.17.0") {
		t.Fatalf("Archive(kueue, v0.9.9) = %v, want an error naming the versions there are", err)
	}
}

type chartMeta struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

func chartYAML(t *testing.T, archive []byte, name string) chartMeta {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("no %s in the archive", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != name {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		var m chartMeta
		if err := yaml.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
}
