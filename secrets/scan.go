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

// MaxScannedFileSize bounds what ScanFS reads of one file; a fleet repository holds
// small text files, and a token in a larger file is still found in its first part.
const MaxScannedFileSize = 16 << 20

// ScanFS walks fsys and reports every valid token in its regular files. skip, when not
// nil, leaves out paths (and, for directories, everything below them): a checkout's .git
// directory and the files its .gitignore keeps out of the repository.
func ScanFS(fsys fs.FS, skip func(p string, isDir bool) bool) ([]Leak, error) {
	var leaks []Leak
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
		f, err := fsys.Open(p)
		if err != nil {
			return err
		}
		data, err := io.ReadAll(io.LimitReader(f, MaxScannedFileSize))
		f.Close()
		if err != nil {
			return err
		}
		leaks = append(leaks, ScanBytes(path.Clean(p), data)...)
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
