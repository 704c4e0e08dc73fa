//go:build unix

package fleet

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DirFS reads a file whole through its bare descriptor, not an os.File: what it reads,
// and the errors it gives, are those of the same read through os.DirFS's files, but
// that its errors never name the directory the checkout lies in.
func TestReadLimitedFromDirFSReadsAsThroughOSFiles(t *testing.T) {
	dir := t.TempDir()
	sized := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	files := map[string][]byte{
		"empty.yaml":      {},
		"small.yaml":      []byte("kind: WorkerCluster\n"),
		"at-limit.yaml":   sized(MaxFileSize),
		"over-limit.yaml": sized(MaxFileSize + 4096),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name, file string
		// size is what the file's stat said; a file on disk may change since.
		size int64
		want []byte
		// wantErr is what the error says, when there is one.
		wantErr string
		// dirFSOnly is for an error that os.DirFS gives otherwise: its files name the
		// whole path on disk in the errors of a read.
		dirFSOnly bool
	}{
		{name: "empty file", file: "empty.yaml", want: []byte{}},
		{name: "small file", file: "small.yaml", size: int64(len(files["small.yaml"])), want: files["small.yaml"]},
		{name: "file that grew since its stat", file: "small.yaml", size: 1, want: files["small.yaml"]},
		{name: "file that shrank since its stat", file: "small.yaml", size: 4096, want: files["small.yaml"]},
		{name: "file at the limit", file: "at-limit.yaml", size: MaxFileSize, want: files["at-limit.yaml"]},
		{name: "file over the limit is read one byte past it", file: "over-limit.yaml", size: MaxFileSize + 4096, want: sized(MaxFileSize + 1)},
		{name: "missing file", file: "missing.yaml", wantErr: "open missing.yaml: no such file or directory"},
		{name: "path leaving the checkout", file: "../outside.yaml", wantErr: "open ../outside.yaml: invalid argument"},
		{name: "error of a read", file: ".", wantErr: "read .: is a directory", dirFSOnly: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, fsys := range []struct {
				name string
				fs   fs.FS
			}{{"DirFS", DirFS(dir)}, {"os.DirFS", os.DirFS(dir)}} {
				if tc.dirFSOnly && fsys.name != "DirFS" {
					continue
				}
				got, err := readLimited(fsys.fs, tc.file, tc.size)
				if tc.wantErr != "" {
					if err == nil || err.Error() != tc.wantErr {
						t.Errorf("%s: error %v, want %q", fsys.name, err, tc.wantErr)
					}
					if err != nil && strings.Contains(err.Error(), dir) {
						t.Errorf("%s: the error names the checkout's directory: %v", fsys.name, err)
					}
					if tc.file == "missing.yaml" && !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s: error %v is not fs.ErrNotExist", fsys.name, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", fsys.name, err)
				}
				if !bytes.Equal(got, tc.want) {
					t.Errorf("%s: read %d bytes, want %d", fsys.name, len(got), len(tc.want))
				}
			}
		})
	}
}
