// Package components names the components the agent installs and upgrades on a worker,
// Kueue and JobSet, and the versions this release of flotilla can install: those whose
// charts are embedded in its build (package charts). The hub, built from the same
// release, validates fleet.yaml against the same list without linking the charts.
//
// The hub says which images a worker's components run (Spec); the worker says which it
// accepts (ImagePolicy, from the agent's Helm values), and a desired state outside that
// installs nothing.
package components

import "slices"

// Component is a component the agent installs on workers.
type Component string

const (
	Kueue  Component = "kueue"
	JobSet Component = "jobset"
)

// All is every component, in the order the agent installs them: JobSet first, so that the
// kinds Kueue's integrations watch exist when Kueue starts.
func All() []Component { return []Component{JobSet, Kueue} }

// Installable is the versions of c this release can install, oldest first. `make
// generate` embeds their charts from the Go modules go.mod names; a test of package
// charts fails when this list and the embedded charts differ.
func Installable(c Component) []string {
	switch c {
	case Kueue:
		return []string{"v0.17.0"}
	case JobSet:
		return []string{"v0.11.1"}
	}
	return nil
}

// CanInstall reports whether this release can install version of c.
func CanInstall(c Component, version string) bool {
	return slices.Contains(Installable(c), version)
}
