//go:build unix

package fleet

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// DirFS is os.DirFS(dir) for the loader: a checkout of a fleet repository, read from
// disk. Its Open asks for a non-blocking descriptor. For a regular file that changes
// nothing, but it spares what os.Open does to offer each file to the poller: make the
// descriptor non-blocking, be refused by epoll, which takes no regular files, and make
// it blocking again. Those are four fcntl calls per file; where system calls are dear,
// as in a virtual machine, they cost a load of 10,000 clusters from disk a seventh of
// its time. The loader itself reads each file whole with no os.File at all (readWhole).
// A FIFO, which the loader refuses but a checkout may hold, opens at once instead of
// waiting for a writer.
func DirFS(dir string) fs.FS {
	return dirFS{osFS: os.DirFS(dir).(osFS), dir: dir}
}

// osFS is what os.DirFS offers besides Open, but for ReadFile: os.ReadFile opens files
// as os.Open does, so fs.ReadFile reads through dirFS.Open instead.
type osFS interface {
	fs.ReadDirFS
	fs.StatFS
	fs.ReadLinkFS
}

type dirFS struct {
	osFS
	dir string
}

// path is where on disk the file name of the checkout lies, for the operation op; a
// name that would leave the checkout is refused as os.DirFS refuses it.
func (d dirFS) path(op, name string) (string, error) {
	if d.dir == "" || !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return filepath.Join(d.dir, name), nil
}

func (d dirFS) Open(name string) (fs.File, error) {
	full, err := d.path("open", name)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(full, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		// As os.DirFS does, the error names the file as the caller did, not where the
		// checkout lies.
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			pe.Path = name
		}
		return nil, err
	}
	return f, nil
}

// readWhole reads the file name into data with nothing but open, read and close. An
// os.File would add an allocation and a cleanup of its own, and offer the descriptor to
// the poller, which refuses a regular file: one system call more per file, which the
// loader, reading each file whole and at once, has no use for.
func (d dirFS) readWhole(name string, data []byte) ([]byte, error) {
	full, err := d.path("open", name)
	if err != nil {
		return nil, err
	}
	var fd int
	for {
		fd, err = syscall.Open(full, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	defer syscall.Close(fd)
	data, err = readInto(descriptor(fd), data)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return data, nil
}

// descriptor is an open file read through its bare descriptor.
type descriptor int

func (fd descriptor) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		n, err := syscall.Read(int(fd), b)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}
