package main

import (
	"archive/tar"
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// packDir writes the tree under dir as an uncompressed tar to archive, by way of a
// temporary file renamed at the end, so that an interrupted build never leaves a
// truncated archive under the final name. The layers inside are compressed already. Like
// the layers, the archive depends on the tree's content alone: entries in lexical order
// (fs.WalkDir's), relative names, root-owned, 0644 files and 0755 directories, the epoch
// as every time.
func packDir(dir, archive string) (int64, error) {
	tmp := archive + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", archive, err)
	}
	defer os.Remove(tmp)
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	err = fs.WalkDir(os.DirFS(dir), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || name == "." {
			return err
		}
		hdr := &tar.Header{Name: name, ModTime: epoch, Format: tar.FormatUSTAR, Mode: 0o644, Typeflag: tar.TypeReg}
		if d.IsDir() {
			hdr.Name += "/"
			hdr.Mode, hdr.Typeflag = 0o755, tar.TypeDir
			return tw.WriteHeader(hdr)
		}
		src, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
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
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", archive, err)
	}
	st, err := os.Stat(tmp)
	if err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, archive); err != nil {
		return 0, fmt.Errorf("writing %s: %w", archive, err)
	}
	return st.Size(), nil
}
