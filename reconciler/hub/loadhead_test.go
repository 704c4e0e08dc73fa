package hub

import (
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// readCounter records every path a loader asks a file system about.
type readCounter struct {
	fsys fstest.MapFS

	mu    sync.Mutex
	paths map[string]int
}

func (r *readCounter) saw(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paths[name]++
}

func (r *readCounter) Open(name string) (fs.File, error) { r.saw(name); return r.fsys.Open(name) }
func (r *readCounter) ReadDir(name string) ([]fs.DirEntry, error) {
	r.saw(name)
	return r.fsys.ReadDir(name)
}
func (r *readCounter) Stat(name string) (fs.FileInfo, error)  { r.saw(name); return r.fsys.Stat(name) }
func (r *readCounter) Lstat(name string) (fs.FileInfo, error) { r.saw(name); return r.fsys.Lstat(name) }
func (r *readCounter) ReadLink(name string) (string, error) {
	r.saw(name)
	return r.fsys.ReadLink(name)
}

// A commit that changes one cluster costs the hub that cluster's directory, whatever
// the fleet's size; a fleet-wide change reads everything again. Either way the hub holds
// what loading the whole head would give.
func TestAHeadIsReadOnlyWhereItChanged(t *testing.T) {
	const clusters = 1000
	old := fleetgen.Fleet(clusters, fleetgen.Options{OverlayEvery: 10})
	changed := fleetgen.ClusterName(clusters - 7)
	dir := path.Join(fleet.ClustersDir, changed)
	cordoned := maps.Clone(old)
	file := path.Join(dir, fleet.ClusterFile)
	cordoned[file] = &fstest.MapFile{Data: []byte(strings.Replace(string(old[file].Data), "cordoned: false", "cordoned: true", 1)), Mode: 0o644}
	added := maps.Clone(old)
	fresh := fleetgen.ClusterName(clusters)
	fleetgen.AddCluster(added, fresh, old[path.Join(fleet.ClustersDir, fleetgen.ClusterName(0), fleet.EnrollmentFile)].Data, clusters, fleetgen.Options{})

	// The same cluster, its cluster.yaml a symbolic link to a file outside clusters/;
	// and fleet.yaml a link into config/.
	shared := "shared/" + changed + ".yaml"
	linked := maps.Clone(old)
	linked[file] = &fstest.MapFile{Data: []byte("../../" + shared), Mode: fs.ModeSymlink}
	linked[shared] = old[file]
	linkedCordoned := maps.Clone(linked)
	linkedCordoned[shared] = cordoned[file]
	const fleetTarget = "config/fleet.yaml"
	fleetLinked := maps.Clone(old)
	fleetLinked[fleet.FleetFile] = &fstest.MapFile{Data: []byte(fleetTarget), Mode: fs.ModeSymlink}
	fleetLinked[fleetTarget] = old[fleet.FleetFile]
	fleetChanged := maps.Clone(fleetLinked)
	fleetChanged[fleetTarget] = &fstest.MapFile{Data: append(slices.Clone(old[fleet.FleetFile].Data), "\n# reviewed\n"...), Mode: 0o644}

	tests := []struct {
		name string
		// old is the last head, the common fleet when nil.
		old  fstest.MapFS
		head fstest.MapFS
		// ch is what the commit changed, in the paths the source names.
		ch fleet.Change
		// lastErr is why the last head was not applied, if it was not.
		lastErr string
		// whole is set when the whole head is read again; otherwise every read must
		// fall within these cluster directories.
		whole  bool
		within []string
	}{
		{name: "a cordon reads that cluster's directory alone", head: cordoned, ch: fleet.Change{Paths: []string{dir}}, within: []string{dir}},
		{name: "a new cluster reads its directory alone", head: added, ch: fleet.Change{Paths: []string{path.Join(fleet.ClustersDir, fresh)}},
			within: []string{path.Join(fleet.ClustersDir, fresh)}},
		{name: "a file the hub does not read reads nothing", head: old, ch: fleet.Change{Paths: []string{"README.md"}}},
		{name: "a fleet-wide change reads the whole head", head: cordoned, ch: fleet.Change{Paths: []string{fleet.FleetFile}}, whole: true},
		{name: "a file outside clusters/ that a cluster links to reads that cluster's directory", old: linked, head: linkedCordoned,
			ch: fleet.Change{Paths: []string{shared}}, within: []string{dir, path.Dir(shared)}},
		{name: "a file fleet.yaml links to reads the whole head", old: fleetLinked, head: fleetChanged,
			ch: fleet.Change{Paths: []string{fleetTarget}}, whole: true},
		// What changed while the fleet was broken was not applied: a cordon made then
		// must not wait for the next fleet-wide change.
		{name: "a cordon after a head that was not applied reads the whole head", head: cordoned, ch: fleet.Change{Paths: []string{dir}},
			lastErr: "clusters/gpu-00001: over the head's budget", whole: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Source{hub: &Hub{}}
			last := tt.old
			if last == nil {
				last = old
			}
			first, _ := s.loadHead(last, fleet.Change{All: true, Reason: "first read"})
			s.setHead(plumbing.NewHash("0123456789abcdef0123456789abcdef01234567"), first, tt.lastErr, "")
			counter := &readCounter{fsys: tt.head, paths: map[string]int{}}
			got, aff := s.loadHead(counter, tt.ch)
			if aff.All != tt.whole {
				t.Errorf("every cluster affected: %t, want %t (%s)", aff.All, tt.whole, aff.Reason)
			}

			var outside []string
			dirs := map[string]bool{}
			for p := range counter.paths {
				if strings.HasPrefix(p, fleet.ClustersDir+"/") {
					dirs[strings.SplitN(p, "/", 3)[1]] = true
				}
				if !tt.whole && !inside(p, tt.within) {
					outside = append(outside, p)
				}
			}
			if len(outside) > 0 {
				t.Errorf("%d paths read outside %v, e.g. %q", len(outside), tt.within, outside[0])
			}
			if tt.whole && len(dirs) < clusters {
				t.Errorf("a fleet-wide change read %d cluster directories of %d", len(dirs), clusters)
			}
			wantDirs := 0
			for _, d := range tt.within {
				if strings.HasPrefix(d, fleet.ClustersDir+"/") {
					wantDirs++
				}
			}
			if !tt.whole && len(dirs) != wantDirs {
				t.Errorf("%d cluster directories read, want %d", len(dirs), wantDirs)
			}

			whole := fleet.Load(tt.head)
			if len(got.Clusters) != len(whole.Clusters) {
				t.Fatalf("%d clusters held, a whole load has %d", len(got.Clusters), len(whole.Clusters))
			}
			for name, c := range whole.Clusters {
				h := got.Clusters[name]
				if h == nil || h.Digest != c.Digest || h.Valid() != c.Valid() {
					t.Fatalf("cluster %s differs from a whole load of the head", name)
				}
			}
			if (tt.head[file] == cordoned[file] || tt.head[shared] == cordoned[file]) && !got.Clusters[changed].Object.Spec.Cordoned {
				t.Errorf("%s is not cordoned after the commit that cordons it", changed)
			}
		})
	}
}

func inside(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}
