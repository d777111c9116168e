package systemd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/daemon"
	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"golang.org/x/sys/unix"
)

// # The file descriptor store
//
// systemd keeps fds a service hands it (sd_notify FDSTORE=1 with the fds as
// SCM_RIGHTS) across a crash and restart of the service, and passes them to
// the next process of the service as LISTEN_FDS, named by LISTEN_FDNAMES
// (sd_notify(3), "File Descriptor Store" in systemd.service(5)). corrald
// parks in it what the children need to outlive it: each execution's
// pidfd, output read ends and stdin write end, named as reactor.FdName
// says ("<exec-id>.<role>").
//
// Two traps: systemd drops a stored fd that polls POLLHUP or POLLERR (the
// pidfd of a reaped child, a pipe whose writer closed) unless it was stored
// with FDPOLL=0, which Store always sets; and a stored stdin write end keeps
// the child's stdin open until it is removed (Remove).

// validFdName reports whether name may be an FDNAME: at most 255
// characters, printable ASCII, no ':' (it separates LISTEN_FDNAMES).
func validFdName(name string) bool {
	if name == "" || len(name) > 255 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x21 || c > 0x7e || c == ':' {
			return false
		}
	}
	return true
}

// Store parks fd in systemd's fd store under name (FDSTORE=1, FDNAME=,
// FDPOLL=0). systemd keeps its own duplicate: the caller still owns fd.
// It reports false and no error when corrald is not a systemd service.
// Storing again under a name already in the store adds another fd with
// that name; Remove drops all of them.
func Store(name string, fd int) (bool, error) {
	if !validFdName(name) {
		return false, fmt.Errorf("fd store: invalid fd name %q", name)
	}
	return sendWithFds("FDSTORE=1\nFDNAME="+name+"\nFDPOLL=0", []int{fd})
}

// Remove drops every fd stored under name (FDSTOREREMOVE=1).
func Remove(name string) (bool, error) {
	if !validFdName(name) {
		return false, fmt.Errorf("fd store: invalid fd name %q", name)
	}
	return notify("FDSTOREREMOVE=1\nFDNAME=" + name)
}

// Reloading tells systemd a reload has begun (RELOADING=1 with
// MONOTONIC_USEC, as sd_notify(3) asks); READY=1 (Ready) ends it.
func Reloading() (bool, error) {
	return notify("RELOADING=1\n" + daemon.SdNotifyMonotonicUsec())
}

// MainPID tells systemd the service's main pid (MAINPID=).
func MainPID(pid int) (bool, error) { return notify("MAINPID=" + strconv.Itoa(pid)) }

// FdStoreMax returns the unit's FileDescriptorStoreMax= as systemd >= 254
// announces it in $FDSTORE; ok is false when the variable is unset (an
// older systemd, or no store): ask the service manager instead.
func FdStoreMax() (n int, ok bool) {
	v := os.Getenv("FDSTORE")
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, false
	}
	return n, true
}

// Passed is what the process was given at start: by systemd (socket
// activation and the fd store, LISTEN_FDS/LISTEN_FDNAMES) and by a
// handover from the previous image of corrald (HandoverEnv).
type Passed struct {
	// Sockets are the fds named SocketName (or all unnamed sockets when none
	// is named so), as *os.File for net.FileListener.
	Sockets []*os.File
	// Fds maps every other name to its fds, CLOEXEC set, owned by the
	// caller. A name may carry more than one fd (stored twice).
	Fds map[string][]int
}

// Close closes everything p holds.
func (p *Passed) Close() {
	for _, f := range p.Sockets {
		f.Close()
	}
	for _, fds := range p.Fds {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	p.Sockets, p.Fds = nil, nil
}

// ListenerName names, in a handover, the listening socket corrald created
// itself (not socket-activated).
const ListenerName = "corrald.listener"

// HandoverEnv carries the fds a handover passes to the next image of
// corrald: "<fd>=<name>" entries separated by ':'.
const HandoverEnv = "CORRAL_HANDOVER_FDS"

// HandoverValue encodes fds (number -> name) for HandoverEnv.
func HandoverValue(fds map[int]string) string {
	parts := make([]string, 0, len(fds))
	for fd, name := range fds {
		parts = append(parts, strconv.Itoa(fd)+"="+name)
	}
	return strings.Join(parts, ":")
}

var (
	passedOnce sync.Once
	passed     Passed
	passedErr  error
)

// TakePassed returns what was passed to this process (see Passed), once:
// later calls return an empty Passed. It unsets LISTEN_PID, LISTEN_FDS,
// LISTEN_FDNAMES and HandoverEnv and marks every fd close-on-exec.
func TakePassed() (Passed, error) {
	first := false
	passedOnce.Do(func() {
		first = true
		passed, passedErr = readPassed()
	})
	if !first {
		return Passed{Fds: map[string][]int{}}, nil
	}
	return passed, passedErr
}

func readPassed() (p Passed, err error) {
	p.Fds = map[string][]int{}
	defer func() {
		os.Unsetenv("LISTEN_PID")
		os.Unsetenv("LISTEN_FDS")
		os.Unsetenv("LISTEN_FDNAMES")
		os.Unsetenv(HandoverEnv)
	}()
	var errs []error
	type passedFd struct {
		fd   int
		name string
	}
	var socks []passedFd
	add := func(fd int, name string) {
		unix.CloseOnExec(fd)
		if isSocket(fd) {
			socks = append(socks, passedFd{fd, name})
			return
		}
		p.Fds[name] = append(p.Fds[name], fd)
	}
	// The listening socket: those named SocketName (or ListenerName) if any
	// is, else every passed socket. Other sockets go to Fds.
	defer func() {
		named := false
		for _, s := range socks {
			named = named || s.name == SocketName || s.name == ListenerName
		}
		for _, s := range socks {
			if !named || s.name == SocketName || s.name == ListenerName {
				p.Sockets = append(p.Sockets, os.NewFile(uintptr(s.fd), s.name))
			} else {
				p.Fds[s.name] = append(p.Fds[s.name], s.fd)
			}
		}
	}()
	if pid, err := strconv.Atoi(os.Getenv("LISTEN_PID")); err == nil && pid == os.Getpid() {
		n, _ := strconv.Atoi(os.Getenv("LISTEN_FDS"))
		names := strings.Split(os.Getenv("LISTEN_FDNAMES"), ":")
		for i := 0; i < n; i++ {
			name := "LISTEN_FD_" + strconv.Itoa(3+i)
			if i < len(names) && names[i] != "" {
				name = names[i]
			}
			add(3+i, name)
		}
	}
	if v := os.Getenv(HandoverEnv); v != "" {
		for _, ent := range strings.Split(v, ":") {
			num, name, ok := strings.Cut(ent, "=")
			fd, err := strconv.Atoi(num)
			if !ok || err != nil || fd < 3 {
				errs = append(errs, fmt.Errorf("%s: bad entry %q", HandoverEnv, ent))
				continue
			}
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
				errs = append(errs, fmt.Errorf("%s: fd %d (%s) is not open", HandoverEnv, fd, name))
				continue
			}
			add(fd, name)
		}
	}
	return p, errors.Join(errs...)
}

func isSocket(fd int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
}

// ListenersFrom turns passed socket files (Passed.Sockets) into Unix
// listeners that do not unlink their path on Close. It closes the files.
func ListenersFrom(files []*os.File) ([]*net.UnixListener, error) {
	var out []*net.UnixListener
	var errs []error
	for _, f := range files {
		l, err := net.FileListener(f)
		f.Close() // FileListener dups the fd
		if err != nil {
			errs = append(errs, fmt.Errorf("socket-activated fd %s: %w", f.Name(), err))
			continue
		}
		ul, ok := l.(*net.UnixListener)
		if !ok {
			l.Close()
			errs = append(errs, fmt.Errorf("socket-activated fd %s: %s listener, want a unix stream socket", f.Name(), l.Addr().Network()))
			continue
		}
		ul.SetUnlinkOnClose(false)
		out = append(out, ul)
	}
	if err := errors.Join(errs...); err != nil {
		for _, l := range out {
			l.Close()
		}
		return nil, err
	}
	return out, nil
}

// FdStoreCapacity returns how many fds the service's fd store holds
// (FileDescriptorStoreMax=): $FDSTORE where systemd sets it (>= 254), else
// the unit's property over D-Bus. 0 and no error when corrald is not a
// systemd service.
func FdStoreCapacity(ctx context.Context) (int, error) {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return 0, nil
	}
	if n, ok := FdStoreMax(); ok {
		return n, nil
	}
	dial := sddbus.NewSystemConnectionContext
	if os.Geteuid() == 0 {
		dial = sddbus.NewSystemdConnectionContext
	}
	c, err := dial(ctx)
	if err != nil {
		return 0, fmt.Errorf("fd store capacity: connect to systemd: %w", err)
	}
	defer c.Close()
	unit, err := c.GetUnitNameByPID(ctx, uint32(os.Getpid()))
	if err != nil {
		return 0, fmt.Errorf("fd store capacity: own unit: %w", err)
	}
	p, err := c.GetServicePropertyContext(ctx, unit, "FileDescriptorStoreMax")
	if err != nil {
		return 0, fmt.Errorf("fd store capacity: %s FileDescriptorStoreMax: %w", unit, err)
	}
	switch v := p.Value.Value().(type) {
	case uint32:
		return int(v), nil
	case uint64:
		return int(v), nil
	}
	return 0, fmt.Errorf("fd store capacity: %s FileDescriptorStoreMax is %s", unit, p.Value.Signature())
}
