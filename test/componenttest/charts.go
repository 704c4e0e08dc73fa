package componenttest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/charts"
)

// BumpedChart is c's embedded chart with its Chart.yaml version replaced: a new chart
// release as the next version of the component would bring, for an upgrade test when
// the module proxy holds one version only.
func BumpedChart(t testing.TB, c components.Component, version, chartVersion string) []byte {
	t.Helper()
	b, err := charts.Archive(c, version)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(zr)
	bumped := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == string(c)+"/Chart.yaml" {
			old := "\nversion: " + strings.TrimPrefix(version, "v") + "\n"
			if !bytes.Contains(data, []byte(old)) {
				t.Fatalf("%s has no %q", h.Name, old)
			}
			data = bytes.Replace(data, []byte(old), []byte("\nversion: "+chartVersion+"\n"), 1)
			bumped = true
		}
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if !bumped {
		t.Fatalf("no Chart.yaml in the chart of %s %s", c, version)
	}
	if err := errors.Join(tw.Close(), zw.Close()); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
