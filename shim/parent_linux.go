package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Fixed descriptor numbers in the shim, from cmd.ExtraFiles.
const (
	childConfigFD  = 3 // sealed memfd with the JSON Config
	childErrFD     = 4 // write end of the exec-error pipe
	childReleaseFD = 5 // read end of the release pipe (only when Hold)
	// childBinaryFD is the pinned corral-shim (UseBinary) in the child: the
	// file the child execs, as /proc/self/fd/6.
	childBinaryFD = 6
)

// selfExe is what the shim is started from by default: the running binary.
// Tests work unchanged because their TestMain dispatches to Main.
const selfExe = "/proc/self/exe"

// pin is the corral-shim that UseBinary pinned: what Wrap and WrapPooled
// start instead of selfExe. f nil: none, start selfExe.
var pin struct {
	mu       sync.Mutex
	f        *os.File // our own descriptor of it, close-on-exec; never closed
	dev, ino uint64   // what f referred to when pinned
	path     string   // where it was opened, to pin it again from
	lost     func(error)
	// retired are descriptors found to name another file (see binary):
	// kept reachable, so that no finalizer closes what is someone
	// else's number now.
	retired []*os.File
}

// UseBinary makes Wrap and WrapPooled start the shim from f, an executable
// whose main calls Main (cmd/corral-shim), instead of re-executing the
// running binary. A small shim starts faster than corrald, whose package
// initialisation (SQLite, D-Bus, logging) every shim would otherwise pay.
// UseBinary keeps its own descriptor of f for the life of the process (the
// caller may close f), so what runs is the file opened now even if its
// path is replaced later (an upgrade while the daemon runs cannot mix
// versions).
//
// The child gets that descriptor among its own files, at childBinaryFD, and
// execs /proc/self/fd/6: a number os/exec itself puts there between fork and
// exec. Exec'ing the daemon's own number instead (/proc/self/fd/<n>) is not
// safe at any n: in the child the Go runtime parks its exec-error pipe,
// and any fd it must move, on the numbers just above the highest fd the
// child is given, so with about n fds open in the daemon (the child's
// stdout at n-1) the pipe lands on n and the exec opens a pipe: EACCES
// ("fork/exec /proc/self/fd/100: permission denied" under load, CI's
// intermittent failure after reloads).
//
// The descriptor is one that nothing else in the process may close; if
// something does anyway (a double close of a number since reused), the
// number soon names another file. So each Wrap first checks that the
// descriptor still is the file pinned (fstat: same device and inode); when
// it is not, it calls lost with an error saying what the descriptor is now,
// and pins the file again from its path if that still is the same file
// (else it falls back to selfExe). lost may be nil. Call UseBinary once,
// before the first Wrap.
func UseBinary(f *os.File, lost func(error)) error {
	own, err := pinFile(f)
	if err != nil {
		return fmt.Errorf("shim: pin %s: %w", f.Name(), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(own.Fd()), &st); err != nil {
		own.Close()
		return fmt.Errorf("shim: pin %s: %w", f.Name(), os.NewSyscallError("fstat", err))
	}
	pin.mu.Lock()
	defer pin.mu.Unlock()
	pin.f, pin.dev, pin.ino, pin.path, pin.lost = own, st.Dev, st.Ino, f.Name(), lost
	return nil
}

// pinFile returns a close-on-exec duplicate of f numbered at least
// pinnedFDMin, out of the way of the low numbers a process's early files
// take.
func pinFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, pinnedFDMin)
	if err != nil {
		return nil, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// binary is what Wrap and WrapPooled start, and the file to pass the child
// at childBinaryFD: the pinned shim, checked (see UseBinary), or selfExe
// and nil.
func binary() (string, *os.File) {
	pin.mu.Lock()
	if pin.f == nil {
		pin.mu.Unlock()
		return selfExe, nil
	}
	fd := int(pin.f.Fd())
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Dev == pin.dev && st.Ino == pin.ino {
		f := pin.f
		pin.mu.Unlock()
		return pinnedPath, f
	}
	now, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		now = "closed"
	}
	lostErr := fmt.Errorf("shim: the pinned %s (fd %d) was closed by something else in the process: fd %d is now %s", pin.path, fd, fd, now)
	// That number is someone else's now: never ours to close.
	pin.retired = append(pin.retired, pin.f)
	pin.f = nil
	if f, err := repinLocked(); err != nil {
		lostErr = fmt.Errorf("%w; cannot pin it again (%v): starting shims from the running binary", lostErr, err)
	} else {
		pin.f = f
		lostErr = fmt.Errorf("%w; pinned again at fd %d", lostErr, f.Fd())
	}
	path, f, lost := selfExe, pin.f, pin.lost
	if f != nil {
		path = pinnedPath
	}
	pin.mu.Unlock()
	if lost != nil {
		lost(lostErr)
	}
	return path, f
}

// pinnedPath is what a child started from the pinned shim execs.
var pinnedPath = "/proc/self/fd/" + strconv.Itoa(childBinaryFD)

// repinLocked opens pin.path again, if it still is the file pinned, and
// returns a descriptor of it numbered as UseBinary's. pin.mu held.
func repinLocked() (*os.File, error) {
	f, err := os.Open(pin.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, os.NewSyscallError("fstat", err)
	}
	if st.Dev != pin.dev || st.Ino != pin.ino {
		return nil, fmt.Errorf("%s was replaced since it was pinned", pin.path)
	}
	return pinFile(f)
}

// pinnedFDMin is the lowest fd UseBinary pins the shim at. The number
// does not matter to the child (it gets the file at childBinaryFD); a
// high one only keeps the pin clear of the numbers early files take.
const pinnedFDMin = 100

// shimArgv0 is the shim's argv[0], visible in ps until the command execs.
const shimArgv0 = "corral-shim"

// Handle is the parent's side of one wrapped command: the release pipe's
// write end (when held) and the exec-error pipe's read end.
//
// Ownership: the Handle owns every descriptor it holds and closes them in
// Close; callers must not close ErrFD themselves (remove it from an epoll
// set before Close). One owner holds and releases: the code that started
// the child (the reactor), never the scope backend that places it. The
// methods are safe for concurrent use. Terminal state: closed.
type Handle struct {
	mu sync.Mutex
	// Child ends, kept open in the parent only until cmd.Start has run.
	config   *os.File // memfd
	errW     *os.File
	releaseR *os.File
	// Parent ends.
	releaseW *os.File // nil when not held or after Release/Close
	dispatch *os.File // pooled: our end of the dispatch socket, until Dispatch
	errR     int      // -1 after Close; O_NONBLOCK|O_CLOEXEC

	held     bool
	pooled   bool // WrapPooled: held until Dispatch, Release is a no-op
	released bool
	closed   bool
}

// ErrClosed is returned by Handle methods called after Close.
var ErrClosed = errors.New("shim: handle closed")

// ErrAborted is returned by Release after Abort.
var ErrAborted = errors.New("shim: aborted before release")

// Wrap rewrites cmd so that starting it starts the shim, which runs
// cfg.Argv with cfg.Env, and returns the Handle of the pipes shared with it.
//
// Wrap sets cmd.Path (to the running binary), cmd.Args, cmd.Env (the shim's
// own, minimal: the daemon's environment must not reach the child),
// cmd.ExtraFiles, and clears cmd.Err (a lookup error of exec.Command made
// with the daemon's PATH, which does not matter: the shim looks the command
// up with cfg.Env's PATH). cmd.Dir, if set and cfg.Dir is empty, moves into
// the Config so that a bad directory is reported as an ExecError rather
// than as a Start error. SysProcAttr, Stdin, Stdout and Stderr are kept.
// cmd must not have ExtraFiles.
//
// The caller then calls cmd.Start, then CloseChildEnds (whether Start
// succeeded or not), then, when held, Release once the child may run, and
// finally Close once it no longer needs ErrFD.
func Wrap(cmd *exec.Cmd, cfg Config) (*Handle, error) {
	if len(cfg.Argv) == 0 || cfg.Argv[0] == "" {
		return nil, errors.New("shim: wrap: empty argv")
	}
	if cmd.Process != nil {
		return nil, errors.New("shim: wrap: command already started")
	}
	if len(cmd.ExtraFiles) != 0 {
		return nil, errors.New("shim: wrap: command has ExtraFiles, which the shim does not pass on")
	}
	if cfg.Dir == "" {
		cfg.Dir = cmd.Dir
	}
	if cfg.Env == nil {
		cfg.Env = []string{}
	}
	h := &Handle{errR: -1, held: cfg.Hold}
	ok := false
	defer func() {
		if !ok {
			h.Close()
		}
	}()

	var err error
	if h.config, err = writeConfig(cfg); err != nil {
		return nil, err
	}
	if err := h.openErrPipe(); err != nil {
		return nil, err
	}
	if cfg.Hold {
		if h.releaseR, h.releaseW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("shim: release pipe: %w", err)
		}
	}
	runShim(cmd, h)
	ok = true
	return h, nil
}

// runShim points cmd at the shim, with h's files: the running binary (or
// its pinned copy) as cmd.Path, the shim's argv, its own environment, no
// directory, and ExtraFiles from childFiles. Wrap and wrapPooled both end
// with it, once h's config, error pipe and release end are open.
func runShim(cmd *exec.Cmd, h *Handle) {
	var bin *os.File
	cmd.Path, bin = binary()
	cmd.Args = []string{shimArgv0, Arg}
	// The shim's own environment, never the command's (that is cfg.Env,
	// passed in the config): one P keeps the held shim at few threads,
	// which count against the scope's TasksMax once it is moved there.
	cmd.Env = []string{"GOMAXPROCS=1"}
	cmd.Dir = ""
	cmd.Err = nil
	cmd.ExtraFiles = childFiles(h.config, h.errW, h.releaseR, bin)
}

// childFiles is a shim's cmd.ExtraFiles: config, errW, release (or nil:
// closed in the child) onto fds 3, 4 and 5, and the pinned binary, if
// any, onto childBinaryFD (the next one).
func childFiles(config, errW, release, bin *os.File) []*os.File {
	files := []*os.File{config, errW, release} // fds 3, 4, 5
	if bin != nil {
		// ExtraFiles[i] is the child's fd 3+i.
		files = append(files, bin)
	}
	return files
}

// writeConfig puts cfg as JSON into a sealed memfd.
func writeConfig(cfg Config) (*os.File, error) {
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("shim: encode config: %w", err)
	}
	fd, err := unix.MemfdCreate("corral-shim-config", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shim: config: %w", os.NewSyscallError("memfd_create", err))
	}
	f := os.NewFile(uintptr(fd), "corral-shim-config")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("shim: write config: %w", err)
	}
	// Sealed, the child reads exactly what the parent wrote.
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("shim: seal config: %w", os.NewSyscallError("fcntl", err))
	}
	return f, nil
}

// CloseChildEnds closes the parent's copies of the descriptors the shim
// inherited. Call it right after cmd.Start, whether Start succeeded or not:
// until then ErrFD cannot reach EOF. Idempotent.
func (h *Handle) CloseChildEnds() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closeChildEndsLocked()
}

func (h *Handle) closeChildEndsLocked() {
	for _, f := range []**os.File{&h.config, &h.errW, &h.releaseR} {
		if *f != nil {
			(*f).Close()
			*f = nil
		}
	}
}

// Held reports whether the shim was configured to wait for Release.
func (h *Handle) Held() bool { return h.held }

// Release lets a held shim go on: it writes one byte to the release pipe
// and closes it. Idempotent; a no-op when the shim was not held. It fails
// if the shim is already gone (EPIPE) or the Handle is closed.
func (h *Handle) Release() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	if !h.held || h.released || h.pooled {
		return nil
	}
	if h.releaseW == nil {
		return ErrAborted
	}
	h.released = true
	w := h.releaseW
	h.releaseW = nil
	_, err := w.Write([]byte{1})
	w.Close()
	if err != nil {
		return fmt.Errorf("shim: release: %w", err)
	}
	return nil
}

// Abort makes a held shim that was not released exit with ExitParentGone
// without running anything: it closes the release pipe unwritten. ErrFD
// stays open (it then reaches EOF). A no-op after Release or Close, or when
// not held. Use it when placing the child failed.
func (h *Handle) Abort() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.releaseW != nil {
		h.releaseW.Close()
		h.releaseW = nil
	}
	if h.dispatch != nil {
		h.dispatch.Close()
		h.dispatch = nil
	}
	// Also drop the parent's copy of the read end, so that a child that was
	// never started cannot keep anything open.
	h.closeChildEndsLocked()
}

// ErrFD is the read end of the exec-error pipe: non-blocking, close-on-exec,
// owned by the Handle (do not close it). It becomes readable when the shim
// reports an error (then ReadExecError returns it) or reaches EOF when the
// command was exec'd or the shim died. -1 after Close.
func (h *Handle) ErrFD() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.errR
}

// ReadExecError reads the exec-error pipe fd (Handle.ErrFD) once:
// (report, nil) when the shim reported a failure; (nil, nil) at EOF, which
// means the command was exec'd (or the shim died without a report; the
// exit status tells); (nil, ErrPending) when neither happened yet.
func ReadExecError(fd int) (*ExecError, error) {
	buf := make([]byte, 2*maxReport)
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil, ErrPending
		case err != nil:
			return nil, fmt.Errorf("shim: read exec result: %w", os.NewSyscallError("read", err))
		case n == 0:
			return nil, nil
		}
		var e ExecError
		if err := json.Unmarshal(buf[:n], &e); err != nil {
			return nil, fmt.Errorf("shim: decode exec result: %w", err)
		}
		return &e, nil
	}
}

// WaitExec blocks until the shim exec'd the command (nil, nil), reported a
// failure (report, nil), or timeout passes (nil, ErrPending). It is for
// callers without an event loop (tests, tools); the reactor polls ErrFD.
func (h *Handle) WaitExec(timeout time.Duration) (*ExecError, error) {
	fd := h.ErrFD()
	if fd < 0 {
		return nil, ErrClosed
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("shim: wait exec: %w", os.NewSyscallError("poll", err))
		}
		if n == 0 {
			return nil, ErrPending
		}
		return ReadExecError(fd)
	}
}

// Close closes every descriptor the Handle still holds. A held shim that
// was not released then reads EOF and exits with ExitParentGone without
// running anything. Idempotent.
func (h *Handle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	h.closeChildEndsLocked()
	if h.dispatch != nil {
		h.dispatch.Close() // an undispatched pooled shim exits 125
		h.dispatch = nil
	}
	if h.releaseW != nil {
		h.releaseW.Close()
		h.releaseW = nil
	}
	if h.errR >= 0 {
		unix.Close(h.errR)
		h.errR = -1
	}
	return nil
}

// openErrPipe creates the exec-error pipe. The parent's read end is
// non-blocking so that the reactor can put it in its epoll set; the child's
// write end is inherited without O_CLOEXEC (os/exec dup2s ExtraFiles), and
// the shim sets O_CLOEXEC on it again so that a successful exec closes it:
// EOF then means "exec'd".
func (h *Handle) openErrPipe() error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return fmt.Errorf("shim: error pipe: %w", os.NewSyscallError("pipe2", err))
	}
	h.errR = p[0]
	if err := unix.SetNonblock(p[1], false); err != nil {
		unix.Close(p[1])
		return fmt.Errorf("shim: error pipe: %w", os.NewSyscallError("fcntl", err))
	}
	h.errW = os.NewFile(uintptr(p[1]), "corral-shim-error")
	return nil
}
