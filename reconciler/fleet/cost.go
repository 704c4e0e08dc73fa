package fleet

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// Limits of what kustomize reads for one cluster's render: its preset and its overlay
// together, counted each time a load of a kustomization reads a file, as kustomize reads
// it again.
//
// Kustomize takes no context, so that nothing stops a render once it runs, and its
// cost grows with the square of the objects it holds (each object it adds is compared
// with those it has). A real preset renders tens of objects from a few KiB, and an
// overlay adds a handful; a 31 KiB file of objects included from 16 directories, each
// with its own name prefix, is 4,000 objects that keep kustomize busy for 12 seconds.
// The limits leave real fleets a margin of tens to a hundredfold and keep the worst
// render allowed to about half a second of one core (BenchmarkRenderAtTheCap in
// reconciler/render: 0.6 s for 998 objects), a sixteenth of that head's.
const (
	// MaxRenderObjects bounds the objects of one cluster's render: the YAML documents of
	// every resource file, each item of a List counted as kustomize inlines it.
	MaxRenderObjects = 1000
	// MaxRenderInput bounds the bytes of the kustomizations, resource files and patch
	// and replacement files that kustomize reads for one cluster's render.
	MaxRenderInput = 4 << 20
)

// renderCost is what a render reads so far.
type renderCost struct {
	objects, bytes int
}

// countObjects is how many objects kustomize makes of the documents of one file: one a
// document, except that a FooList with items stands for its items, which may be Lists
// themselves (kustomize's resource.Factory inlines them). An empty document is none.
func countObjects(docs []*yaml.Node) int {
	n := 0
	for _, d := range docs {
		for _, c := range d.Content {
			n += objectsIn(c)
		}
	}
	return n
}

func objectsIn(n *yaml.Node) int {
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return 0
	case n.Kind != yaml.MappingNode:
		return 1
	}
	_, kind := lookup(n, "kind")
	_, items := lookup(n, "items")
	if kind == nil || !strings.HasSuffix(kind.Value, "List") || items == nil {
		return 1
	}
	switch {
	case items.Kind == yaml.SequenceNode:
		sum := 0
		for _, it := range items.Content {
			sum += objectsIn(it)
		}
		return sum
	case items.ShortTag() == "!!null":
		return 0
	}
	return 1
}
