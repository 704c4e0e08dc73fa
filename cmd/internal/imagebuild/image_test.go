package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"encoding/pem"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// The archive is what a user pushes: an OCI layout whose index.json names the image
// index by its tag and full name, and whose index holds a complete image per platform
// (every blob present, every digest, size and diff ID right).
func TestArchivesAreOCILayoutsWithAnImagePerPlatform(t *testing.T) {
	f := archives(t)
	t.Logf("compiled the binaries for %d platforms in %s, assembled both archives in %s", len(f.builder.Platforms), f.compiled.Round(time.Second), f.assembled.Round(time.Second))
	for _, b := range f.first {
		t.Run(b.Image.Name, func(t *testing.T) {
			if want := filepath.Join(filepath.Dir(b.Archive), b.Image.Name+"-"+f.meta.Version+".tar"); b.Archive != want {
				t.Errorf("archive %s, want %s", b.Archive, want)
			}
			t.Logf("%s: %d bytes, %s", filepath.Base(b.Archive), b.Size, b.Digest)

			var marker struct {
				Version string `json:"imageLayoutVersion"`
			}
			raw, err := os.ReadFile(filepath.Join(f.layouts[b.Image.Name], "oci-layout"))
			if err == nil {
				err = json.Unmarshal(raw, &marker)
			}
			if err != nil || marker.Version != "1.0.0" {
				t.Errorf("oci-layout %q (%v), want imageLayoutVersion 1.0.0", raw, err)
			}
			outer, err := layout.ImageIndexFromPath(f.layouts[b.Image.Name])
			if err != nil {
				t.Fatal(err)
			}
			om, err := outer.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			wantTag := map[string]string{
				"org.opencontainers.image.ref.name": f.meta.Version,
				"io.containerd.image.name":          "ghcr.io/flotilla-gitops/" + b.Image.Name + ":" + f.meta.Version,
			}
			if len(om.Manifests) != 1 || om.Manifests[0].MediaType != types.OCIImageIndex || !cmp.Equal(om.Manifests[0].Annotations, wantTag) {
				t.Errorf("index.json names %+v, want the image index alone, annotated %v", om.Manifests, wantTag)
			}
			idx := f.index(t, b.Image.Name)
			// Fast: unpack checks the layers' bytes against their digests and diff IDs,
			// once per test process for all the tests that look inside.
			if err := validate.Index(idx, validate.Fast); err != nil {
				t.Fatalf("the image index does not validate: %v", err)
			}
			for _, p := range f.builder.Platforms {
				f.unpack(t, b.Image.Name, p)
			}
			if d, err := idx.Digest(); err != nil || d != b.Digest {
				t.Errorf("index digest %s (%v), want the one the build reported, %s", d, err, b.Digest)
			}
			im, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if im.MediaType != types.OCIImageIndex {
				t.Errorf("index media type %s, want %s", im.MediaType, types.OCIImageIndex)
			}
			if diff := cmp.Diff(labels(f.meta, b.Image), im.Annotations); diff != "" {
				t.Errorf("index annotations (-want +got):\n%s", diff)
			}
			var platforms []string
			for _, d := range im.Manifests {
				platforms = append(platforms, d.Platform.String())
				if d.MediaType != types.OCIManifestSchema1 || d.ArtifactType != "" {
					t.Errorf("%s: media type %s, artifact type %q: want an OCI image manifest and no artifact type", d.Platform, d.MediaType, d.ArtifactType)
				}
			}
			if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
				t.Errorf("platforms %v, want %v", platforms, want)
			}

		})
	}
}

// What `docker inspect` shows and the kubelet runs: the binary as entrypoint, the nonroot
// user by number (runAsNonRoot can check it), the labels, and an environment with nothing
// in it but PATH.
func TestImageConfigRunsTheBinaryAsNonrootWithTheLabels(t *testing.T) {
	f := archives(t)
	version, err := appVersion(filepath.Join(f.root, "charts/flotilla-agent/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		image      string
		entrypoint []string
	}{
		{"flotilla-hub", []string{"/usr/local/bin/flotilla-hub"}},
		{"flotilla-agent", []string{"/usr/local/bin/flotilla-agent"}},
	} {
		for _, p := range f.builder.Platforms {
			t.Run(tc.image+"/"+p.String(), func(t *testing.T) {
				img := f.image(t, tc.image, p)
				if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
					t.Errorf("manifest media type %s (%v), want %s", mt, err, types.OCIManifestSchema1)
				}
				m, err := img.Manifest()
				if err != nil {
					t.Fatal(err)
				}
				if m.Config.MediaType != types.OCIConfigJSON || len(m.Layers) != 2 {
					t.Errorf("config %s with %d layers, want %s with the base files and the binaries", m.Config.MediaType, len(m.Layers), types.OCIConfigJSON)
				}
				cf, err := img.ConfigFile()
				if err != nil {
					t.Fatal(err)
				}
				if cf.OS != p.OS || cf.Architecture != p.Architecture {
					t.Errorf("config for %s/%s, want %s", cf.OS, cf.Architecture, p.String())
				}
				if !cf.Created.Equal(f.meta.Created) {
					t.Errorf("created %s, want %s (the commit's time or SOURCE_DATE_EPOCH)", cf.Created.Time, f.meta.Created)
				}
				want := v1.Config{
					Entrypoint: tc.entrypoint,
					User:       "65532:65532",
					WorkingDir: "/home/nonroot",
					Env:        []string{"PATH=/usr/local/bin"},
					Labels: map[string]string{
						"org.opencontainers.image.source":      "https://github.com/flotilla-gitops/flotilla",
						"org.opencontainers.image.version":     version,
						"org.opencontainers.image.revision":    f.revision,
						"org.opencontainers.image.title":       tc.image,
						"org.opencontainers.image.description": imageNamed(t, tc.image).Description,
						"org.opencontainers.image.created":     f.meta.Created.Format(time.RFC3339),
					},
				}
				if diff := cmp.Diff(want, cf.Config); diff != "" {
					t.Errorf("config (-want +got):\n%s", diff)
				}
				if !strings.HasPrefix(want.Labels["org.opencontainers.image.description"], "The flotilla ") {
					t.Errorf("description %q", want.Labels["org.opencontainers.image.description"])
				}
			})
		}
	}
}

// Same sources, same digests and same bytes: a second build from the same binaries gives
// archives identical to the first.
func TestBuildingAgainGivesTheSameDigestsAndBytes(t *testing.T) {
	f := archives(t)
	for i, first := range f.first {
		second := f.second[i]
		if first.Digest != second.Digest {
			t.Errorf("%s: digest %s, then %s", first.Image.Name, first.Digest, second.Digest)
		}
		if a, b := fileSum(t, first.Archive), fileSum(t, second.Archive); a != b {
			t.Errorf("%s: archive sha256 %x, then %x", first.Image.Name, a, b)
		}
	}
}

// The binaries run from the unpacked image and say the charts' appVersion: the agent's
// image holds the installer beside the agent, where the agent looks for it.
func TestBinariesInsideTheImageRunAndPrintTheChartsVersion(t *testing.T) {
	f := archives(t)
	p := hostPlatform(t, f)
	for _, img := range images() {
		t.Run(img.Name, func(t *testing.T) {
			dir, hdrs := f.unpack(t, img.Name, p)
			for _, c := range img.Commands {
				bin := path.Join(binDir, c)
				if hdrs[bin] == nil || path.Dir(bin) != path.Dir(img.Entrypoint()[0]) {
					t.Fatalf("%s is not beside the entrypoint %s", bin, img.Entrypoint()[0])
				}
				cmd := exec.CommandContext(t.Context(), filepath.Join(dir, filepath.FromSlash(bin)), "--version")
				cmd.Dir = filepath.Join(dir, filepath.FromSlash(homeDir))
				cmd.Env = env()
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s --version: %v\n%s", bin, err, out)
				}
				fields := strings.Fields(string(out))
				if len(fields) < 2 || fields[0] != c || fields[1] != f.meta.Version {
					t.Errorf("%s --version printed %q, want %q followed by the charts' appVersion %s", bin, out, c, f.meta.Version)
				}
			}
		})
	}
}

// The files besides the binaries: the nonroot user the configuration names, a /tmp
// anyone may write, a home only nonroot may, and the public roots for the agent's wss://,
// where Go looks for them. Nothing else.
func TestImageFileSystemHasTheUserTheRootsAndTmp(t *testing.T) {
	f := archives(t)
	for _, img := range images() {
		for _, p := range f.builder.Platforms {
			t.Run(img.Name+"/"+p.String(), func(t *testing.T) {
				dir, hdrs := f.unpack(t, img.Name, p)
				type meta struct {
					Type     byte
					Mode     int64
					UID, GID int
				}
				want := map[string]meta{
					"/etc":                               {tar.TypeDir, 0o755, 0, 0},
					"/etc/group":                         {tar.TypeReg, 0o644, 0, 0},
					"/etc/nsswitch.conf":                 {tar.TypeReg, 0o644, 0, 0},
					"/etc/passwd":                        {tar.TypeReg, 0o644, 0, 0},
					"/etc/ssl":                           {tar.TypeDir, 0o755, 0, 0},
					"/etc/ssl/certs":                     {tar.TypeDir, 0o755, 0, 0},
					"/etc/ssl/certs/ca-certificates.crt": {tar.TypeReg, 0o644, 0, 0},
					"/home":                              {tar.TypeDir, 0o755, 0, 0},
					"/home/nonroot":                      {tar.TypeDir, 0o700, 65532, 65532},
					"/tmp":                               {tar.TypeDir, 0o1777, 0, 0},
					"/usr":                               {tar.TypeDir, 0o755, 0, 0},
					"/usr/local":                         {tar.TypeDir, 0o755, 0, 0},
					"/usr/local/bin":                     {tar.TypeDir, 0o755, 0, 0},
				}
				for _, c := range img.Commands {
					want["/usr/local/bin/"+c] = meta{tar.TypeReg, 0o755, 0, 0}
				}
				got := map[string]meta{}
				for name, h := range hdrs {
					got[name] = meta{h.Typeflag, h.Mode, h.Uid, h.Gid}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("files (-want +got):\n%s", diff)
				}

				read := func(name string) string {
					b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
					if err != nil {
						t.Fatal(err)
					}
					return string(b)
				}
				if !strings.Contains(read("/etc/passwd"), "\nnonroot:x:65532:65532:nonroot:/home/nonroot:") {
					t.Errorf("/etc/passwd lacks nonroot 65532:\n%s", read("/etc/passwd"))
				}
				if !strings.Contains(read("/etc/group"), "\nnonroot:x:65532:") {
					t.Errorf("/etc/group lacks nonroot 65532:\n%s", read("/etc/group"))
				}

				rest := []byte(read("/etc/ssl/certs/ca-certificates.crt"))
				n := 0
				for {
					var block *pem.Block
					block, rest = pem.Decode(rest)
					if block == nil {
						break
					}
					if _, err := x509.ParseCertificate(block.Bytes); block.Type != "CERTIFICATE" || err != nil {
						t.Fatalf("PEM block %d, %s: %v", n, block.Type, err)
					}
					n++
				}
				if len(bytes.TrimSpace(rest)) != 0 || n < 100 {
					t.Errorf("the CA bundle holds %d certificates and %d bytes that are not PEM, want a public trust store", n, len(rest))
				}
			})
		}
	}
}

// A binary that needs no loader and no libc runs from scratch on any node of its
// architecture; the arm64 ones cannot run here, so their ELF headers and build settings
// say it.
func TestBinariesAreStaticTrimmedAndForTheirPlatform(t *testing.T) {
	f := archives(t)
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, img := range images() {
		for _, p := range f.builder.Platforms {
			t.Run(img.Name+"/"+p.String(), func(t *testing.T) {
				dir, _ := f.unpack(t, img.Name, p)
				for _, c := range img.Commands {
					file := filepath.Join(dir, filepath.FromSlash(path.Join(binDir, c)))
					e, err := elf.Open(file)
					if err != nil {
						t.Fatal(err)
					}
					if e.Machine != machines[p.Architecture] {
						t.Errorf("%s is for %s, want %s", c, e.Machine, machines[p.Architecture])
					}
					for _, prog := range e.Progs {
						if prog.Type == elf.PT_INTERP || prog.Type == elf.PT_DYNAMIC {
							t.Errorf("%s is dynamically linked (%s)", c, prog.Type)
						}
					}
					if s := e.Section(".note.go.buildid"); s != nil {
						t.Errorf("%s has a Go build ID note", c)
					}
					if s := e.Section(".symtab"); s != nil {
						t.Errorf("%s has a symbol table: want -s", c)
					}
					e.Close()

					bi, err := buildinfo.ReadFile(file)
					if err != nil {
						t.Fatal(err)
					}
					settings := map[string]string{}
					for _, s := range bi.Settings {
						settings[s.Key] = s.Value
					}
					for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "GOOS": p.OS, "GOARCH": p.Architecture, "vcs": ""} {
						if settings[k] != want {
							t.Errorf("%s: build setting %s=%q, want %q", c, k, settings[k], want)
						}
					}
					if bi.Path != "github.com/flotilla-gitops/flotilla/cmd/"+c {
						t.Errorf("%s is the build of %s", c, bi.Path)
					}
				}
			})
		}
	}
}

func imageNamed(t *testing.T, name string) image {
	t.Helper()
	for _, img := range images() {
		if img.Name == name {
			return img
		}
	}
	t.Fatalf("no image %s", name)
	return image{}
}

func fileSum(t *testing.T, file string) [sha256.Size]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [sha256.Size]byte(h.Sum(nil))
}
