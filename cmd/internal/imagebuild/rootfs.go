package main

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// entry is one file or directory of a layer, by its absolute path in the image.
type entry struct {
	Path string
	Mode fs.FileMode // permission bits, with fs.ModeDir and fs.ModeSticky where they apply
	UID  int
	GID  int
	// Data is a file's content; Source, if set, is a file on disk to read it from instead.
	Data   []byte
	Source string
}

func (e entry) dir() bool { return e.Mode&fs.ModeDir != 0 }

// baseFiles are the files every image holds besides its binaries.
func baseFiles() []entry {
	id := strconv.Itoa(nonroot)
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:" + id + ":" + id + ":nonroot:" + homeDir + ":/sbin/nologin\n"
	group := "root:x:0:\n" +
		"nobody:x:65534:\n" +
		"nonroot:x:" + id + ":\n"
	return []entry{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Path: "/etc/group", Mode: 0o644, Data: []byte(group)},
		// Go's resolver reads it for the order of /etc/hosts and DNS.
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: caFile, Mode: 0o644, Data: caBundle()},
		{Path: homeDir, Mode: fs.ModeDir | 0o700, UID: nonroot, GID: nonroot},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}
}

// caBundle is Mozilla's trust store from x509roots/fallback as PEM, in the module's order.
// Roots with a constraint beyond X.509 (a distrust-after date) are left out: a PEM file
// would trust them without it.
func caBundle() []byte {
	var b bytes.Buffer
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		// Writing to a bytes.Buffer does not fail.
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate})
	}
	return b.Bytes()
}

// withParents adds the directories above every entry (root-owned, 0755) that the entries
// do not name themselves, as a tar that unpacks the same anywhere must.
func withParents(entries []entry) []entry {
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Path] = true
	}
	out := append([]entry(nil), entries...)
	for _, e := range entries {
		for d := path.Dir(e.Path); d != "/"; d = path.Dir(d) {
			if !have[d] {
				have[d] = true
				out = append(out, entry{Path: d, Mode: fs.ModeDir | 0o755})
			}
		}
	}
	return out
}

// writeRootfs writes the root-owned base files into dir, for the Dockerfile to copy into
// its images. The others (nonroot's home) are left to the Dockerfile's COPY --chown:
// Docker's COPY --from makes whatever it copies root's, so ownership written here would be
// lost there.
func writeRootfs(dir string) error {
	for _, e := range sorted(withParents(baseFiles())) {
		if e.UID != 0 || e.GID != 0 {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(e.Path, "/")))
		if e.dir() {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return fmt.Errorf("writing the base files: %w", err)
			}
		} else if err := os.WriteFile(p, e.Data, 0o644); err != nil {
			return fmt.Errorf("writing the base files: %w", err)
		}
		// MkdirAll and WriteFile apply the umask and leave out the sticky bit.
		if err := os.Chmod(p, e.Mode&(fs.ModePerm|fs.ModeSticky)); err != nil {
			return fmt.Errorf("writing the base files: %w", err)
		}
	}
	return nil
}
