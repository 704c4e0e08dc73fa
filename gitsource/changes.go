package gitsource

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/object"
)

// Changes is what a new head asks the hub to re-read.
type Changes struct {
	// All is set when a fleet-wide input changed, or the history was rewritten: every
	// cluster must be re-read.
	All bool
	// Reason says why All is set, for logs.
	Reason string
	// Clusters are the directories under clusters/ with a change below them, sorted;
	// a directory that was removed or renamed away is among them.
	Clusters []string
}

// Empty reports whether nothing the hub reads changed.
func (c Changes) Empty() bool { return !c.All && len(c.Clusters) == 0 }

// fleetWide are the paths whose change touches every cluster.
func fleetWide(p string) bool {
	return p == "fleet.yaml" || p == ".sops.yaml" || p == "presets" || strings.HasPrefix(p, "presets/")
}

// Diff compares two trees. Subtrees with equal hashes are skipped whole, so the cost
// follows the size of the change, not of the fleet.
func Diff(ctx context.Context, old, new *object.Tree) (Changes, error) {
	diff, err := object.DiffTreeWithOptions(ctx, old, new, &object.DiffTreeOptions{})
	if err != nil {
		return Changes{}, fmt.Errorf("gitsource: comparing trees: %w", err)
	}
	clusters := map[string]bool{}
	var ch Changes
	for _, d := range diff {
		for _, p := range []string{d.From.Name, d.To.Name} {
			switch {
			case p == "":
			case fleetWide(p):
				if !ch.All {
					ch.All, ch.Reason = true, p+" changed"
				}
			case strings.HasPrefix(p, "clusters/"):
				// A file directly under clusters/ counts under its own name: the loader
				// ignores it, so re-reading that name is harmless.
				name, _, _ := strings.Cut(strings.TrimPrefix(p, "clusters/"), "/")
				clusters[name] = true
			}
		}
	}
	ch.Clusters = slices.Sorted(maps.Keys(clusters))
	return ch, nil
}
