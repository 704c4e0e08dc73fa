package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// testDir holds what the tests build, for the whole test process: the archives are
// built once, as `make images` builds them, and every test reads them.
var testDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "imagebuild-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is the one compile of the binaries in this test process and two runs of the
// builder's command line on them, the first's archives also unpacked as OCI layouts.
type fixture struct {
	root string
	meta meta
	// revision is HEAD as git said it before the build.
	revision      string
	builder       builder
	first, second []built
	// layouts are the first archives unpacked, by image name.
	layouts map[string]string
	// compiled and assembled are how long the build took, for the test log.
	compiled, assembled time.Duration

	mu       sync.Mutex
	unpacked map[string]*unpacked
}

// unpacked is an image's file system, laid out in a directory.
type unpacked struct {
	dir string
	// headers are the last tar header of every path.
	headers map[string]*tar.Header
	err     error
}

var (
	fixtureOnce sync.Once
	theFixture  *fixture
	fixtureErr  error
)

// archives builds the archives on first use.
func archives(t *testing.T) *fixture {
	t.Helper()
	fixtureOnce.Do(func() { theFixture, fixtureErr = buildFixture(t.Context()) })
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return theFixture
}

// buildFixture compiles the images' binaries once per platform with the builder's own
// code, then runs the builder's command line twice on them, as `make images` runs it. The
// command runs as a binary of its own, without the race detector that this test process
// carries: compressing the layers under it takes minutes instead of seconds.
func buildFixture(ctx context.Context) (*fixture, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	m, err := readMeta(ctx, root, os.Getenv)
	if err != nil {
		return nil, err
	}
	ps, err := parsePlatforms("linux/amd64,linux/arm64")
	if err != nil {
		return nil, err
	}
	f := &fixture{root: root, meta: m, layouts: map[string]string{}, unpacked: map[string]*unpacked{}}
	if f.revision, err = git(ctx, root, "rev-parse", "HEAD"); err != nil {
		return nil, err
	}
	f.builder = builder{Compiler: compiler{Go: "go", Root: root}, Platforms: ps, Registry: defaultRegistry, Log: slog.New(slog.DiscardHandler)}
	bins := filepath.Join(testDir, "bin")
	start := time.Now()
	if err := f.builder.binaries(ctx, m, images(), bins); err != nil {
		return nil, err
	}
	f.compiled = time.Since(start)

	tool := filepath.Join(testDir, "imagebuild")
	build := exec.CommandContext(ctx, "go", "build", "-o", tool, "./cmd/internal/imagebuild")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building imagebuild: %w\n%s", err, out)
	}
	start = time.Now()
	for i, res := range []*[]built{&f.first, &f.second} {
		out := filepath.Join(testDir, fmt.Sprintf("run%d", i))
		cmd := exec.CommandContext(ctx, tool, "images", "--root", root, "--binaries", bins, "--out", out)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("imagebuild images: %w\n%s", err, stderr.Bytes())
		}
		if *res, err = parseBuilt(stdout.String()); err != nil {
			return nil, err
		}
	}
	f.assembled = time.Since(start) / 2
	for _, b := range f.first {
		dir := filepath.Join(testDir, "layout-"+b.Image.Name)
		if err := untar(b.Archive, dir); err != nil {
			return nil, err
		}
		f.layouts[b.Image.Name] = dir
	}
	return f, nil
}

// parseBuilt reads the command's standard output: a line "<archive> <digest>" per image,
// in the order of images().
func parseBuilt(stdout string) ([]built, error) {
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != len(images()) {
		return nil, fmt.Errorf("imagebuild printed %q, want a line per image", stdout)
	}
	var res []built
	for i, line := range lines {
		archive, digest, ok := strings.Cut(line, " ")
		h, err := v1.NewHash(digest)
		if !ok || err != nil {
			return nil, fmt.Errorf("imagebuild printed %q, want <archive> <digest>", line)
		}
		st, err := os.Stat(archive)
		if err != nil {
			return nil, err
		}
		res = append(res, built{Image: images()[i], Archive: archive, Digest: h, Size: st.Size()})
	}
	return res, nil
}

// repoRoot is the directory of go.mod above the test's working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// image is the image of one platform in the archive of img, read from its layout with
// go-containerregistry, as crane reads it.
func (f *fixture) image(t *testing.T, img string, p v1.Platform) v1.Image {
	t.Helper()
	child := f.index(t, img)
	im, err := child.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.Equals(p) {
			i, err := child.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return i
		}
	}
	t.Fatalf("%s has no image for %s", img, p.String())
	return nil
}

// index is the image index that the layout of img's archive names.
func (f *fixture) index(t *testing.T, img string) v1.ImageIndex {
	t.Helper()
	outer, err := layout.ImageIndexFromPath(f.layouts[img])
	if err != nil {
		t.Fatal(err)
	}
	im, err := outer.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%s's index.json names %d entries, want the image index alone", img, len(im.Manifests))
	}
	child, err := outer.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return child
}

// unpack lays out the file system of img's image for p once per test process: its
// layers extracted in order, as a container runtime does (the images have no whiteouts).
// Each layer's bytes are checked against the digest the manifest names and the diff ID the
// configuration names on the way.
func (f *fixture) unpack(t *testing.T, img string, p v1.Platform) (string, map[string]*tar.Header) {
	t.Helper()
	key := img + "/" + p.String()
	f.mu.Lock()
	u, ok := f.unpacked[key]
	if !ok {
		u = &unpacked{dir: filepath.Join(testDir, "rootfs-"+img+"-"+platformName(p)), headers: map[string]*tar.Header{}}
		u.err = unpackImage(f.image(t, img, p), u.dir, u.headers)
		f.unpacked[key] = u
	}
	f.mu.Unlock()
	if u.err != nil {
		t.Fatalf("unpacking %s: %v", key, u.err)
	}
	return u.dir, u.headers
}

func unpackImage(img v1.Image, dir string, headers map[string]*tar.Header) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		want, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, rc)
		rc.Close()
		if err != nil {
			return err
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != want.String() {
			return fmt.Errorf("layer %s has digest %s", want, got)
		}
		diffID, err := l.DiffID()
		if err != nil {
			return err
		}
		rc, err = l.Uncompressed()
		if err != nil {
			return err
		}
		h.Reset()
		err = extract(tar.NewReader(io.TeeReader(rc, h)), dir, headers)
		if err == nil {
			// The tar's end-of-archive blocks are part of the layer too.
			_, err = io.Copy(h, rc)
		}
		rc.Close()
		if err != nil {
			return err
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID.String() {
			return fmt.Errorf("layer %s uncompresses to %s, want its diff ID %s", want, got, diffID)
		}
	}
	return nil
}

// untar extracts a plain tar file into dir.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return extract(tar.NewReader(f), dir, map[string]*tar.Header{})
}

// extract writes the directories and regular files of tr under dir, keyed in headers by
// their absolute path in the image; anything else, or a path out of dir, is an error.
func extract(tr *tar.Reader, dir string, headers map[string]*tar.Header) error {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + hdr.Name)
		if name != "/"+strings.TrimSuffix(hdr.Name, "/") {
			return fmt.Errorf("tar entry %q is not a clean relative path", hdr.Name)
		}
		headers[name] = hdr
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm(hdr))
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("tar entry %s has type %q: the images hold directories and files only", hdr.Name, hdr.Typeflag)
		}
	}
}

func perm(hdr *tar.Header) os.FileMode { return os.FileMode(hdr.Mode) & os.ModePerm }

// hostPlatform is the platform of the images the tests can run here.
func hostPlatform(t *testing.T, f *fixture) v1.Platform {
	t.Helper()
	for _, p := range f.builder.Platforms {
		if p.Architecture == runtime.GOARCH {
			return p
		}
	}
	t.Fatalf("the images are built for %v, none of which runs on %s", f.builder.Platforms, runtime.GOARCH)
	return v1.Platform{}
}
