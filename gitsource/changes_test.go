package gitsource

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
)

// rawTree writes a tree's bytes from "mode name hash" lines, in the order given: the
// order git sorts entries in, which these cases spell out by hand.
func rawTree(t *testing.T, entries ...string) []byte {
	t.Helper()
	var b []byte
	for _, e := range entries {
		f := strings.Fields(e)
		h, err := hex.DecodeString(fmt.Sprintf("%040s", f[2]))
		if err != nil {
			t.Fatal(err)
		}
		b = append(append(append(b, f[0]+" "+f[1]...), 0), h...)
	}
	return b
}

func TestDiffEntriesMatchesNamesInGitOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new []string
		want     []string
	}{
		{"equal trees", []string{"100644 a 1", "40000 b 2"}, []string{"100644 a 1", "40000 b 2"}, nil},
		{"a file's mode alone", []string{"100644 run.sh 1"}, []string{"100755 run.sh 1"}, []string{"run.sh"}},
		// A directory sorts as if its name ended in "/": after "gpu-b" and "gpu.c",
		// before "gpu0".
		{"a directory between longer names", []string{"100644 gpu-b 1", "100644 gpu.c 2", "40000 gpu 3", "40000 gpu0 4"},
			[]string{"100644 gpu-b 1", "100644 gpu.c 2", "40000 gpu 5", "40000 gpu0 4"}, []string{"gpu"}},
		{"a file replaced by a directory of its name", []string{"100644 gpu 1", "40000 gpu0 2"}, []string{"40000 gpu 1", "40000 gpu0 2"},
			[]string{"gpu", "gpu"}},
		{"added and removed", []string{"40000 a 1", "40000 c 3"}, []string{"40000 b 2", "40000 c 3", "40000 d 4"}, []string{"a", "b", "d"}},
		{"everything from nothing", nil, []string{"40000 a 1", "100644 b 2"}, []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			err := diffEntries(rawTree(t, tc.old...), rawTree(t, tc.new...), func(o, n treeEntry) error {
				got = append(got, string(o.or(n).name))
				return nil
			})
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("changed %q (%v), want %q", got, err, tc.want)
			}
		})
	}
}

func TestDiffRefusesAMalformedTree(t *testing.T) {
	for _, data := range [][]byte{[]byte("100644 a"), []byte("100644 a\x00short"), []byte("no-space\x00" + strings.Repeat("x", 20))} {
		if err := diffEntries(data, nil, func(o, n treeEntry) error { return nil }); err == nil {
			t.Errorf("tree %q read without an error", data)
		}
	}
	s := newStore()
	if _, err := diff(t.Context(), s, plumbing.ZeroHash, plumbing.ZeroHash); err == nil {
		t.Error("a diff of trees the store lacks succeeded")
	}
}

// A head that changes more cluster directories than a fleet is built for asks for
// every cluster to be re-read, rather than for a list the hub would hold name by name.
func TestDiffOfMoreClustersThanAFleetHoldsAsksForAll(t *testing.T) {
	for _, tc := range []struct {
		name    string
		changed int
		all     bool
	}{
		{"as many changed clusters as a fleet holds", maxChangedClusters, false},
		{"one more", maxChangedClusters + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore()
			var file plumbing.Hash
			clustersOf := func() plumbing.Hash {
				// clusters/ holds names git sorts as written, each a different file
				// from the other head's.
				var b []byte
				for i := range tc.changed {
					b = append(append(fmt.Appendf(b, "100644 gpu-%06d", i), 0), file[:]...)
				}
				clusters := newStoredObject(plumbing.TreeObject, b)
				root := newStoredObject(plumbing.TreeObject, append(append([]byte("40000 clusters"), 0), clusters.hash[:]...))
				s.add([]*storedObject{clusters, root})
				return root.hash
			}
			file[0] = 1
			old := clustersOf()
			file[0] = 2
			ch, err := diff(t.Context(), s, old, clustersOf())
			if err != nil {
				t.Fatal(err)
			}
			if ch.All != tc.all || tc.all && (ch.Clusters != nil || !strings.Contains(ch.Reason, "more than 10000 cluster directories changed")) ||
				!tc.all && len(ch.Clusters) != tc.changed {
				t.Fatalf("all %v (%s), %d clusters: want all %v", ch.All, ch.Reason, len(ch.Clusters), tc.all)
			}
		})
	}
}
