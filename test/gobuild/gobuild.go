// Package gobuild builds the project's commands for tests that run them as their users
// do, as separate processes: each command once per test process, however many tests ask.
package gobuild

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// Cache builds commands into Dir. A test package keeps one, with Dir in a directory that
// goes with its tests, such as a control plane's (ControlPlane.Dir).
type Cache struct {
	// Dir is where the binaries are written.
	Dir string
	// Race builds with the race detector, for the commands a race-enabled test runs.
	Race bool

	mu    sync.Mutex
	built map[string]string
}

// Binary returns the path of cmd/<name> built from the repository the test runs in.
func (c *Cache) Binary(tb testing.TB, name string) string {
	tb.Helper()
	path, err := c.build(name)
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

func (c *Cache) build(name string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.built[name]; ok {
		return p, nil
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	if c.Dir == "" {
		return "", fmt.Errorf("building %s: the cache has no directory", name)
	}
	if c.built == nil {
		c.built = map[string]string{}
	}
	out := filepath.Join(c.Dir, name)
	args := []string{"build", "-o", out}
	if c.Race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/"+name)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w\n%s", name, err, b)
	}
	c.built[name] = out
	return out, nil
}
