package secrets

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
)

// tokenPattern finds token-shaped text; a match is a leak only if its checksum holds,
// so that documentation can show the format without tripping the scan.
var tokenPattern = regexp.MustCompile(`flt1_[a-z2-7]{59}`)

// Leak is a plaintext token found in a file.
type Leak struct {
	// File is slash-separated, from the root of the scanned tree.
	File string
	// Line and Column are 1-based; Column counts bytes.
	Line, Column int
	// Fingerprint tells which token leaked without repeating it.
	Fingerprint string
}

func (l Leak) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", l.File, l.Line, l.Column, l.Message())
}

// Message says what was found and what to do, without the position.
func (l Leak) Message() string {
	return fmt.Sprintf("a plaintext enrollment token (fingerprint %s) is in this file; remove it and rotate the token with `flotilla cluster rotate-token`", l.Fingerprint)
}

// Redact replaces every token-shaped text in s, checksum or not, so that a message built
// from a library's error cannot carry a token.
func Redact(s string) string { return tokenPattern.ReplaceAllLiteralString(s, "[REDACTED]") }

// ScanBytes reports every valid token in data, which came from file.
func ScanBytes(file string, data []byte) []Leak {
	var leaks []Leak
	for _, m := range tokenPattern.FindAllIndex(data, -1) {
		t, err := ParseToken(string(data[m[0]:m[1]]))
		if err != nil {
			continue
		}
		line := 1 + bytes.Count(data[:m[0]], []byte{'\n'})
		col := m[0] - (bytes.LastIndexByte(data[:m[0]], '\n') + 1) + 1
		leaks = append(leaks, Leak{File: file, Line: line, Column: col, Fingerprint: t.Hash().Fingerprint()})
	}
	return leaks
}

// ContentIDFS is a file system that names each file's content, such as a commit's tree:
// paths with one ID hold the same bytes.
type ContentIDFS interface {
	fs.FS
	ContentID(name string) (string, error)
}

// CachedFS is a file system that holds the content of some of its files at hand, such
// as a checkout whose fleet was loaded: ScanFS scans that content instead of reading
// those files again.
type CachedFS interface {
	fs.FS
	Cached(name string) (data []byte, ok bool)
}

// MaxScannedFileSize bounds what ScanFS reads of one file; a fleet repository holds
// small text files, and a token in a larger file is still found in its first part.
const MaxScannedFileSize = 16 << 20

// ScanFS walks fsys and reports every valid token in its regular files. skip, when not
// nil, leaves out paths (and, for directories, everything below them): a checkout's .git
// directory and the files its .gitignore keeps out of the repository. On a ContentIDFS
// each content is read and scanned once, whatever the number of paths that name it: a
// commit of 20,000 paths to one blob of a megabyte is 20 GB read path by path. On a
// CachedFS, the content it holds is scanned instead of read.
func ScanFS(fsys fs.FS, skip func(p string, isDir bool) bool) ([]Leak, error) {
	var leaks []Leak
	ids, _ := fsys.(ContentIDFS)
	cache, _ := fsys.(CachedFS)
	// scanned are the leaks of each content scanned, by ID, at the path it was read by.
	scanned := map[string][]Leak{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != "." && skip != nil && skip(p, d.IsDir()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		var id string
		if ids != nil {
			if id, err = ids.ContentID(p); err != nil {
				return err
			}
			if found, ok := scanned[id]; ok {
				for _, l := range found {
					l.File = path.Clean(p)
					leaks = append(leaks, l)
				}
				return nil
			}
		}
		data, err := readScanned(fsys, cache, p)
		if err != nil {
			return err
		}
		found := ScanBytes(path.Clean(p), data)
		if ids != nil {
			scanned[id] = found
		}
		leaks = append(leaks, found...)
		return nil
	})
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return leaks, fmt.Errorf("scanning for plaintext tokens: %s: %w", pe.Path, pe.Err)
		}
		return leaks, fmt.Errorf("scanning for plaintext tokens: %w", err)
	}
	return leaks, nil
}

// readScanned reads what ScanFS scans of the file p: its first MaxScannedFileSize bytes.
func readScanned(fsys fs.FS, cache CachedFS, p string) ([]byte, error) {
	if cache != nil {
		if data, ok := cache.Cached(p); ok {
			return data[:min(len(data), MaxScannedFileSize)], nil
		}
	}
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxScannedFileSize))
}
