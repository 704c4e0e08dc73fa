package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch dates every file in the layers. Not the creation time: a layer whose files did
// not change keeps its digest from one commit to the next, and registries and nodes keep
// one copy of it.
var epoch = time.Unix(0, 0).UTC()

// sorted orders entries by path, so that parents come before their children and the
// same entries always make the same tar.
func sorted(entries []entry) []entry {
	out := slices.Clone(entries)
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// writeLayer writes entries as a gzip-compressed tar to file and returns it as an OCI
// layer. The result depends on the entries alone: sorted, numeric owners, no user or group
// names, the epoch as every time, plain USTAR headers (no PAX records of access times),
// and a gzip header with no name or time.
func writeLayer(file string, entries []entry) (v1.Layer, error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("writing layer %s: %w", file, err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	zw, err := gzip.NewWriterLevel(bw, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, e := range sorted(withParents(entries)) {
		if err := writeEntry(tw, e); err != nil {
			return nil, fmt.Errorf("writing layer %s: %s: %w", file, e.Path, err)
		}
	}
	for _, c := range []io.Closer{tw, zw} {
		if err := c.Close(); err != nil {
			return nil, fmt.Errorf("writing layer %s: %w", file, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("writing layer %s: %w", file, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("writing layer %s: %w", file, err)
	}
	// The layer is compressed already: go-containerregistry sees the gzip magic, takes
	// the file's bytes as they are and computes the digests once.
	l, err := tarball.LayerFromFile(file, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("reading layer %s: %w", file, err)
	}
	return l, nil
}

func writeEntry(tw *tar.Writer, e entry) error {
	hdr := &tar.Header{
		// Relative names, as `docker save` and ko write them.
		Name:    strings.TrimPrefix(e.Path, "/"),
		Mode:    int64(e.Mode.Perm()),
		Uid:     e.UID,
		Gid:     e.GID,
		ModTime: epoch,
		Format:  tar.FormatUSTAR,
	}
	if e.Mode&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	if e.dir() {
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		return tw.WriteHeader(hdr)
	}
	hdr.Typeflag = tar.TypeReg
	if e.Source == "" {
		hdr.Size = int64(len(e.Data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(e.Data)
		return err
	}
	src, err := os.Open(e.Source)
	if err != nil {
		return err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	hdr.Size = st.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.Copy(tw, src); err != nil {
		return err
	}
	return nil
}
