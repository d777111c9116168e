package cgroupv2

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Watch returns a non-blocking inotify file that becomes readable when one
// of d's named interface files changes: the kernel signals a modification
// of cgroup.events when "populated" or "frozen" flips, of memory.events on
// a new memory event. The first name must exist; later ones are watched
// where they exist. The caller owns the file and closes it, which also
// unblocks a read in progress.
func (d Dir) Watch(names ...string) (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	for i, name := range names {
		p := filepath.Join(string(d), name)
		if _, err := unix.InotifyAddWatch(fd, p, unix.IN_MODIFY); err != nil && i == 0 {
			unix.Close(fd)
			return nil, fmt.Errorf("watch %s: %w", p, os.NewSyscallError("inotify_add_watch", err))
		}
	}
	return os.NewFile(uintptr(fd), "inotify:"+string(d)), nil
}
