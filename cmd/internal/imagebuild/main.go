package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

const usage = `usage:
  imagebuild images [flags]   build the archives of flotilla-hub and flotilla-agent
  imagebuild rootfs DIR       write the images' base files into DIR (for cmd/Dockerfile)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "imagebuild:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return flag.ErrHelp
	}
	switch args[0] {
	case "rootfs":
		if len(args) != 2 {
			fmt.Fprint(stderr, usage)
			return flag.ErrHelp
		}
		return writeRootfs(args[1])
	case "images":
		return runImages(ctx, args[1:], stdout, stderr, getenv)
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

func runImages(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("imagebuild images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", ".", "the repository")
	out := fs.String("out", "bin/images", "where the archives are written")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "the platforms of the image index, comma-separated")
	registry := fs.String("registry", defaultRegistry, "the registry and namespace of the names recorded in the archives")
	goTool := fs.String("go", "go", "the go command")
	prebuilt := fs.String("binaries", "", "take the binaries from DIR/<os>-<arch>/, built as this command builds them, instead of compiling them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	ps, err := parsePlatforms(*platforms)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	m, err := readMeta(ctx, *root, getenv)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	start := time.Now()
	b := builder{Compiler: compiler{Go: *goTool, Root: *root}, Platforms: ps, Registry: strings.TrimSuffix(*registry, "/"), Log: log}
	imgs := images()
	bins := *prebuilt
	if bins == "" {
		bins = filepath.Join(work, "bin")
		if err := b.binaries(ctx, m, imgs, bins); err != nil {
			return err
		}
	}
	res, err := b.assemble(ctx, m, imgs, bins, work, *out)
	if err != nil {
		return err
	}
	for _, r := range res {
		log.Info("wrote", "archive", r.Archive, "digest", r.Digest.String(), "bytes", r.Size)
		fmt.Fprintf(stdout, "%s %s\n", r.Archive, r.Digest)
	}
	log.Info("done", "version", m.Version, "revision", m.Revision, "created", m.Created.Format(time.RFC3339), "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// parsePlatforms reads "linux/amd64,linux/arm64".
func parsePlatforms(s string) ([]v1.Platform, error) {
	var ps []v1.Platform
	for f := range strings.SplitSeq(s, ",") {
		p, err := v1.ParsePlatform(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("platform %q: %w", f, err)
		}
		if p.OS != "linux" {
			return nil, fmt.Errorf("platform %q: the images are for linux", f)
		}
		for _, q := range ps {
			if q.Equals(*p) {
				return nil, fmt.Errorf("platform %q named twice", f)
			}
		}
		ps = append(ps, *p)
	}
	if len(ps) == 0 {
		return nil, errors.New("no platforms")
	}
	return ps, nil
}
