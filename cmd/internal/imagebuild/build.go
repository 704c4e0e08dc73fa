package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"
)

// OCI annotation and label keys the builder writes.
const (
	labelSource      = "org.opencontainers.image.source"
	labelVersion     = "org.opencontainers.image.version"
	labelRevision    = "org.opencontainers.image.revision"
	labelTitle       = "org.opencontainers.image.title"
	labelDescription = "org.opencontainers.image.description"
	labelCreated     = "org.opencontainers.image.created"
	// refName tags an entry of an OCI layout's index.json (skopeo's oci-archive:FILE:TAG);
	// containerdName is the full name Docker's containerd image store and containerd give
	// an image they load.
	refName        = "org.opencontainers.image.ref.name"
	containerdName = "io.containerd.image.name"
)

// builder makes the images' archives.
type builder struct {
	Compiler  compiler
	Platforms []v1.Platform
	// Registry prefixes the names recorded in the archives: <Registry>/<image>:<version>.
	Registry string
	Log      *slog.Logger
}

// built is one archive the builder wrote.
type built struct {
	Image   image
	Archive string
	// Digest is the image index's, the digest the pushed tag resolves to.
	Digest v1.Hash
	Size   int64
}

// platformDir is where binaries compiles a platform's binaries, under its directory.
func platformDir(dir string, p v1.Platform) string {
	return filepath.Join(dir, platformName(p))
}

// platformName is linux-amd64 for linux/amd64.
func platformName(p v1.Platform) string { return strings.ReplaceAll(p.String(), "/", "-") }

// binaries compiles the commands of imgs for every platform under dir.
func (b builder) binaries(ctx context.Context, m meta, imgs []image, dir string) error {
	commands := commandsOf(imgs)
	// One platform at a time: go build already uses every core for one.
	for _, p := range b.Platforms {
		start := time.Now()
		if err := b.Compiler.compile(ctx, p, m.Version, platformDir(dir, p), commands); err != nil {
			return err
		}
		b.Log.Info("compiled", "platform", p.String(), "commands", commands, "duration", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// commandsOf is every command of imgs, once.
func commandsOf(imgs []image) []string {
	var commands []string
	for _, img := range imgs {
		for _, c := range img.Commands {
			if !slices.Contains(commands, c) {
				commands = append(commands, c)
			}
		}
	}
	return commands
}

// assemble writes an archive for each of imgs into out from the binaries that binaries
// left in bins, using work for its layers and layouts.
func (b builder) assemble(ctx context.Context, m meta, imgs []image, bins, work, out string) ([]built, error) {
	if err := os.MkdirAll(filepath.Join(work, "layers"), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	base, err := writeLayer(filepath.Join(work, "layers", "base.tar.gz"), baseFiles())
	if err != nil {
		return nil, err
	}

	// Compressing the binaries' layers is most of the work: one per core.
	binLayers := make([][]v1.Layer, len(imgs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, img := range imgs {
		binLayers[i] = make([]v1.Layer, len(b.Platforms))
		for j, p := range b.Platforms {
			g.Go(func() error {
				if err := gctx.Err(); err != nil {
					return err
				}
				var files []entry
				for _, c := range img.Commands {
					files = append(files, entry{Path: path.Join(binDir, c), Mode: 0o755, Source: filepath.Join(platformDir(bins, p), c)})
				}
				l, err := writeLayer(filepath.Join(work, "layers", img.Name+"-"+platformName(p)+".tar.gz"), files)
				binLayers[i][j] = l
				return err
			})
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	var res []built
	for i, img := range imgs {
		idx, err := b.index(m, img, base, binLayers[i])
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		archive := filepath.Join(out, img.Name+"-"+m.Version+".tar")
		size, err := b.write(ctx, idx, img, m, filepath.Join(work, "layout-"+img.Name), archive)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		d, err := idx.Digest()
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		res = append(res, built{Image: img, Archive: archive, Digest: d, Size: size})
	}
	return res, nil
}

// labels are the image's OCI labels, also the annotations of its index, where registries
// that show an index look for them.
func labels(m meta, img image) map[string]string {
	return map[string]string{
		labelSource:      sourceURL,
		labelVersion:     m.Version,
		labelRevision:    m.Revision,
		labelTitle:       img.Name,
		labelDescription: img.Description,
		labelCreated:     m.Created.Format(time.RFC3339),
	}
}

// index is the image index of img over the platforms, one image per platform.
func (b builder) index(m meta, img image, base v1.Layer, bins []v1.Layer) (v1.ImageIndex, error) {
	created := v1.Time{Time: m.Created}
	var adds []mutate.IndexAddendum
	for j, p := range b.Platforms {
		im := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		im, err := mutate.Append(im,
			mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "imagebuild: /etc/passwd, /etc/group, /etc/nsswitch.conf, " + caFile + ", " + homeDir + ", /tmp"}},
			mutate.Addendum{Layer: bins[j], History: v1.History{Created: created, CreatedBy: "imagebuild: " + strings.Join(img.Commands, ", ") + " in " + binDir}},
		)
		if err != nil {
			return nil, err
		}
		cf, err := im.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
		cf.Created = created
		cf.Config = v1.Config{
			Entrypoint: img.Entrypoint(),
			User:       user(),
			WorkingDir: homeDir,
			Env:        env(),
			Labels:     labels(m, img),
		}
		if im, err = mutate.ConfigFile(im, cf); err != nil {
			return nil, err
		}
		adds = append(adds, mutate.IndexAddendum{Add: plainImage{im}, Descriptor: v1.Descriptor{Platform: &p}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	return mutate.Annotations(idx, labels(m, img)).(v1.ImageIndex), nil
}

// write lays idx out as an OCI image layout in dir and packs it into archive.
func (b builder) write(ctx context.Context, idx v1.ImageIndex, img image, m meta, dir, archive string) (int64, error) {
	if err := os.RemoveAll(dir); err != nil {
		return 0, err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return 0, fmt.Errorf("writing the OCI layout: %w", err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		refName:        m.Version,
		containerdName: b.Registry + "/" + img.Name + ":" + m.Version,
	})); err != nil {
		return 0, fmt.Errorf("writing the OCI layout: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return packDir(dir, archive)
}

// plainImage keeps an image's descriptor in the index free of an artifactType, which
// go-containerregistry otherwise fills with the config's media type: the image-index
// specification reserves it for artifacts, and an image is none.
type plainImage struct{ v1.Image }

// ArtifactType is read by go-containerregistry's partial.Descriptor.
func (plainImage) ArtifactType() (string, error) { return "", nil }
