package main

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/tests/testenv"
)

// fdCloexec reads fd's flags from /proc/self/fdinfo, as a user would check
// them: whether O_CLOEXEC (02000000) is among them.
func fdCloexec(t *testing.T, fd int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			if err != nil {
				t.Fatalf("fdinfo %d flags %q: %v", fd, v, err)
			}
			return n&unix.O_CLOEXEC != 0
		}
	}
	t.Fatalf("fdinfo %d has no flags: %q", fd, b)
	return false
}

// TestMarkInheritedCloexec: an fd inherited without close-on-exec (a dup,
// as a handover's previous image or a careless parent leaves it) has
// FD_CLOEXEC after the start-up marking, by close_range and, where that
// fails, by the /proc/self/fd walk.
func TestMarkInheritedCloexec(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		name := "close_range"
		if fallback {
			name = "proc walk"
		}
		t.Run(name, func(t *testing.T) {
			if fallback {
				old := closeRangeCloexec
				closeRangeCloexec = func() error { return unix.EPERM }
				t.Cleanup(func() { closeRangeCloexec = old })
			}
			var fds []int
			for range 3 {
				fd, err := unix.Dup(1) // no O_CLOEXEC
				if err != nil {
					t.Fatal(err)
				}
				fds = append(fds, fd)
			}
			t.Cleanup(func() {
				for _, fd := range fds {
					unix.Close(fd)
				}
			})
			for _, fd := range fds {
				if fdCloexec(t, fd) {
					t.Fatalf("fd %d: close-on-exec set before the marking", fd)
				}
			}
			if err := markInheritedCloexec(); err != nil {
				t.Fatal(err)
			}
			for _, fd := range fds {
				if !fdCloexec(t, fd) {
					t.Errorf("fd %d: close-on-exec not set by markInheritedCloexec", fd)
				}
			}
			// And every fd above stderr, whoever opened it.
			ents, err := os.ReadDir("/proc/self/fd")
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				fd, _ := strconv.Atoi(e.Name())
				if fd <= 2 {
					continue
				}
				if _, err := os.Stat("/proc/self/fdinfo/" + e.Name()); err != nil {
					continue // the directory's own fd, closed since
				}
				if !fdCloexec(t, fd) {
					t.Errorf("fd %d: close-on-exec not set after markInheritedCloexec", fd)
				}
			}
		})
	}
}

// TestExecKeepingForksNothingInWindow: while a handover's fds have
// close-on-exec cleared for the exec, a child started by another goroutine
// (os/exec) does not get them: its start waits until exec returned and the
// flag is back. The exec here fails (the path the old image carries on
// from), after giving the other goroutine time to fork: without the lock
// the child forks in the window and holds the fd.
func TestExecKeepingForksNothingInWindow(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	fd := int(r.Fd())
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		testenv.Skip(t, err)
	}
	var child *exec.Cmd
	started := make(chan error, 1)
	errExec := errors.New("exec failed (test)")
	err = execKeeping(map[int]string{fd: "test.stdout"}, func() error {
		if fdCloexec(t, fd) {
			t.Errorf("fd %d: close-on-exec still set when exec runs", fd)
		}
		go func() {
			child = exec.Command(sleep, "30")
			started <- child.Start()
		}()
		// Long enough for the goroutine to reach its fork; it must wait.
		time.Sleep(300 * time.Millisecond)
		return errExec
	}, zerolog.Nop())
	if !errors.Is(err, errExec) {
		t.Fatalf("execKeeping = %v, want the exec's error", err)
	}
	if !fdCloexec(t, fd) {
		t.Errorf("fd %d: close-on-exec not restored after a failed exec", fd)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	defer func() {
		child.Process.Kill()
		child.Wait()
	}()
	var st, cst unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(child.Process.Pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		n, _ := strconv.Atoi(e.Name())
		if n <= 2 {
			continue
		}
		if unix.Stat("/proc/"+strconv.Itoa(child.Process.Pid)+"/fd/"+e.Name(), &cst) == nil && cst.Ino == st.Ino && cst.Dev == st.Dev {
			t.Errorf("the child started during the handover's exec holds the handed-over pipe as fd %d", n)
		} else {
			t.Errorf("the child holds fd %d beyond its stdio", n)
		}
	}
}
