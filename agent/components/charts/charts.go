// Package charts holds the Helm charts of the components the agent installs, packaged
// by `make generate` from the Go modules go.mod names (sigs.k8s.io/kueue and
// sigs.k8s.io/jobset), beside their Apache-2.0 licenses. Only the short-lived binary
// that runs Helm links this package: the charts are 300 KB the agent need not hold.
package charts

import (
	"embed"
	"fmt"
	"io/fs"
	"strings"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

//go:embed *.tgz *.LICENSE
var files embed.FS

// Archive is the packaged chart (a .tgz, as Helm's loader reads it) of c at version.
func Archive(c components.Component, version string) ([]byte, error) {
	b, err := files.ReadFile(fmt.Sprintf("%s-%s.tgz", c, version))
	if err != nil {
		return nil, fmt.Errorf("no chart of %s %s in this build (it has %v): %w", c, version, Versions(c), err)
	}
	return b, nil
}

// Versions is the versions of c whose charts are embedded.
func Versions(c components.Component) []string {
	names, _ := fs.Glob(files, string(c)+"-v*.tgz")
	var vs []string
	for _, n := range names {
		vs = append(vs, strings.TrimSuffix(strings.TrimPrefix(n, string(c)+"-"), ".tgz"))
	}
	return vs
}

// License is the license of c's chart and images.
func License(c components.Component) ([]byte, error) {
	return files.ReadFile(string(c) + ".LICENSE")
}
