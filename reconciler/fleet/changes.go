package fleet

import (
	"slices"
	"strings"
)

// SOPSFile holds the creation rules every enrollment file is encrypted with. The
// loader does not read it, but a change of its rules (new recipients, a rotated key)
// concerns every cluster's enrollment file, so it counts as a fleet-wide input.
const SOPSFile = ".sops.yaml"

// Change is what differs between two trees of a fleet repository, as a Git source
// reports it between two commits.
type Change struct {
	// All is set when any path may have changed (a first read, a rewritten history,
	// more changed paths than the source keeps); Reason says why.
	All    bool
	Reason string
	// Paths are the changed paths, relative to the root: a top-level file
	// ("fleet.yaml"), or an entry of a top-level directory ("presets/a100",
	// "clusters/gpu-a"). A deeper path counts for its first two levels.
	Paths []string
	// FirstChange names the first changed file at or below one of Paths, so that a
	// reason points at a file ("presets/a100/kustomization.yaml"); it is asked once,
	// for a fleet-wide input only. Nil names the path itself.
	FirstChange func(path string) string
}

// Affected is what a Change asks the hub to read again.
type Affected struct {
	// All is set when an input every cluster depends on changed, or when anything may
	// have: every cluster must be read again. Reason says why, for logs.
	All    bool
	Reason string
	// Clusters are the names of the cluster directories with a change below them,
	// sorted; a directory that was removed or renamed away is among them. Nil when All
	// is set.
	Clusters []string
}

// Affected says which clusters c touches. fleet.yaml, .sops.yaml and anything under
// presets/ touch every cluster; a path under clusters/ touches the cluster it names;
// any other path (a README, CI configuration) is not read by the hub and touches none.
func (c Change) Affected() Affected {
	if c.All {
		return Affected{All: true, Reason: c.Reason}
	}
	var clusters []string
	for _, p := range c.Paths {
		top, rest, _ := strings.Cut(p, "/")
		switch top {
		case FleetFile, SOPSFile, PresetsDir:
			first := p
			if c.FirstChange != nil {
				first = c.FirstChange(p)
			}
			return Affected{All: true, Reason: first + " changed"}
		case ClustersDir:
			name, _, _ := strings.Cut(rest, "/")
			if name == "" {
				// clusters/ itself changed without a named entry: a file in its place, or
				// a directory the source could not compare entry by entry.
				return Affected{All: true, Reason: ClustersDir + " changed"}
			}
			// A file directly under clusters/ counts under its own name: the loader
			// ignores it, so reading that name again is harmless.
			clusters = append(clusters, name)
		}
	}
	slices.Sort(clusters)
	return Affected{Clusters: slices.Compact(clusters)}
}

// AffectedIn is Affected for the fleets loaded from either side of the change, with
// what their symbolic links read: a file a cluster's directory links to touches that
// cluster, and one that fleet.yaml or a preset links to touches every cluster, wherever
// in the repository it lies. Affected alone takes a file outside clusters/ and presets/
// for one the hub does not read, and a file in another cluster's directory for that
// cluster's only.
func (c Change) AffectedIn(fleets ...*Fleet) Affected {
	a := c.Affected()
	if a.All {
		return a
	}
	for _, f := range fleets {
		if f == nil {
			continue
		}
		for _, p := range c.Paths {
			if t, ok := reads(f.linked, p); ok {
				return Affected{All: true, Reason: t + " changed, which fleet.yaml or a preset reads through a symbolic link"}
			}
			for name := range f.linking {
				if cl := f.Clusters[name]; cl != nil {
					if _, ok := reads(cl.linked, p); ok {
						a.Clusters = append(a.Clusters, name)
					}
				}
			}
		}
	}
	slices.Sort(a.Clusters)
	a.Clusters = slices.Compact(a.Clusters)
	return a
}

// reads finds among linked a path at or below the changed path p.
func reads(linked []string, p string) (string, bool) {
	for _, t := range linked {
		if t == p || strings.HasPrefix(t, p+"/") {
			return t, true
		}
	}
	return "", false
}
