//go:build !unix

package fleet

import (
	"io/fs"
	"os"
)

// DirFS is os.DirFS(dir): a checkout of a fleet repository, read from disk.
func DirFS(dir string) fs.FS { return os.DirFS(dir) }
