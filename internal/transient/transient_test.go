package transient

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// The resource errnos count however deeply they are wrapped; an answer
// about the thing asked for (no such file, permission, no such process)
// does not.
func TestIs(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("open cgroup.events: %w", &os.PathError{Op: "open", Path: "x", Err: unix.EMFILE}), true},
		{os.NewSyscallError("pidfd_open", unix.ENFILE), true},
		{unix.ENOMEM, true},
		{unix.ENOBUFS, true},
		{unix.EAGAIN, true},
		{unix.EINTR, true},
		{&os.PathError{Op: "open", Path: "x", Err: unix.ENOENT}, false},
		{unix.EACCES, false},
		{unix.ESRCH, false},
		{errors.New("EMFILE"), false},
		{nil, false},
	} {
		if got := Is(tc.err); got != tc.want {
			t.Errorf("Is(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
