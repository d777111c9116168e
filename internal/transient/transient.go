// Package transient tells a failure for want of a resource that passes
// (file descriptors, memory) from any other: the daemon retries the first
// kind, or refuses to let it decide anything lasting.
package transient

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Is reports whether err is a lack of a resource that passes: out of file
// descriptors (EMFILE, ENFILE), memory or buffers (ENOMEM, ENOBUFS),
// EAGAIN, EINTR. Retrying such a failure is what cures it.
func Is(err error) bool {
	for _, errno := range []unix.Errno{unix.EMFILE, unix.ENFILE, unix.ENOMEM, unix.ENOBUFS, unix.EAGAIN, unix.EINTR} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}
