package cgroupv2

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Base is an open cgroup directory whose descendants' files are read
// relative to it (At): one descriptor for a backend's base, held for the
// backend's life, in place of a walk from / at every read (on a hybrid host
// /sys/fs/cgroup/unified/<base>/<id>/cpu.stat is seven lookups, one per
// component, and a cold one costs). Safe for concurrent use; after Close the
// reads go by path.
type Base struct {
	dir Dir
	mu  sync.RWMutex
	fd  int // -1 once closed
}

// OpenBase opens d for reads of its descendants' files.
func OpenBase(d Dir) (*Base, error) {
	fd, err := unix.Open(string(d), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup base %s: %w", d, os.NewSyscallError("open", err))
	}
	return &Base{dir: d, fd: fd}, nil
}

// Close closes the descriptor; later reads go by path. Idempotent.
func (b *Base) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fd < 0 {
		return nil
	}
	err := unix.Close(b.fd)
	b.fd = -1
	if err != nil {
		return fmt.Errorf("close cgroup base %s: %w", b.dir, os.NewSyscallError("close", err))
	}
	return nil
}

// At is the cgroup directory Dir, a descendant of Base named rel under
// it (or, without a Base, Dir alone, read by path). Its reads use one
// buffer on the stack and as few system calls as they can: openat(base
// fd, rel/file), one read (the kernel produces an interface file whole at
// the first read), close; where that fails (Base closed, the base
// directory replaced, the cgroup gone), and without a Base, they read by
// path the same way, so errors are Dir.Read's.
type At struct {
	Dir  Dir
	base *Base
	rel  string
}

// At is the descendant rel of b (a path relative to b, such as "id").
func (b *Base) At(rel string) At {
	return At{Dir: b.dir.Child(rel), base: b, rel: rel}
}

// statBuf is big enough for every file At reads: cpu.stat with the cpu
// controller is about 200 bytes.
const statBuf = 512

// read reads file name into buf; keys are the flat keys wanted from it,
// none for a one-value file.
func (a At) read(name string, buf []byte, keys ...string) ([]byte, error) {
	if a.base != nil {
		a.base.mu.RLock()
		fd := a.base.fd
		var data []byte
		err := os.ErrClosed
		if fd >= 0 {
			data, err = readAt(fd, a.rel+"/"+name, buf, keys)
		}
		a.base.mu.RUnlock()
		if err == nil {
			return data, nil
		}
	}
	path := filepath.Join(string(a.Dir), name)
	return readAt(unix.AT_FDCWD, path, buf, keys)
}

// readAt reads the file name relative to the directory fd dirfd into buf
// (into a larger copy only when it does not fit): openat, read, close.
// Errors are Dir.Read's (*os.PathError "open" or "read" naming name). A
// read that leaves buf room, ends a line and holds every one of keys is
// taken as the whole file, without the read that would return EOF: the
// kernel produces a cgroup interface file whole at the open's first read
// (kernfs seq_file), and what is wanted from it is there in any case.
func readAt(dirfd int, name string, buf []byte, keys []string) ([]byte, error) {
	var fd int
	for {
		var err error
		fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		if err != unix.EINTR {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
	}
	defer unix.Close(fd)
	b := buf[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: name, Err: err}
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
		if len(b) < cap(b) && wholeLines(b, keys) {
			return b, nil
		}
	}
}

// wholeLines reports whether data ends a line and holds every one of keys.
func wholeLines(data []byte, keys []string) bool {
	if len(data) == 0 || data[len(data)-1] != '\n' {
		return false
	}
	for _, k := range keys {
		if _, ok := Keyed(data, k); !ok {
			return false
		}
	}
	return true
}

// Empty is Dir.Empty.
func (a At) Empty() (bool, error) {
	var buf [statBuf]byte
	data, err := a.read("cgroup.events", buf[:], "populated")
	return emptyOf(a.Dir, data, err)
}

// Count is Dir.Count.
func (a At) Count(name string) int64 {
	var buf [statBuf]byte
	data, err := a.read(name, buf[:])
	return countOf(data, err)
}

// countOf is Count of a file read as data, err.
func countOf(data []byte, err error) int64 {
	if err != nil {
		return Unknown
	}
	s := string(bytes.TrimSpace(data))
	if s == "max" {
		return Unknown
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return Unknown
	}
	return n
}

// Keyed reads the value of key in the flat-keyed file name (as Keyed);
// ok is false when the file has no such key or an unparsable value.
func (a At) Keyed(name, key string) (v int64, ok bool, err error) {
	var buf [statBuf]byte
	data, err := a.read(name, buf[:], key)
	if err != nil {
		return 0, false, err
	}
	v, ok = Keyed(data, key)
	return v, ok, nil
}
