// Package sysfile reads the kernel's small interface files (/proc, a
// cgroup's files) in as few system calls as it can: open, read to EOF,
// close, and no other. os.ReadFile also fstats the file and, such a file
// being pollable, registers it with Go's netpoller and takes it out again
// (four fcntl, an epoll_ctl and an fstat more per read). The reactor's loop
// reads cgroup files at every exit and /proc children files at every
// cleanup's reap (issue 11), so those calls are counted.
//
// Any goroutine may call Read; it blocks only as long as the kernel takes
// to produce the file.
package sysfile

import (
	"os"

	"golang.org/x/sys/unix"
)

// Read reads the file at path whole. Its errors are what os.ReadFile gives
// (*os.PathError: "open" or "read", the path, the errno), so
// errors.Is(err, os.ErrNotExist) and the like hold as with os.ReadFile.
func Read(path string) ([]byte, error) {
	var fd int
	for {
		var err error
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		if err != unix.EINTR {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
	}
	defer unix.Close(fd)
	b := make([]byte, 0, 512)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
	}
}
